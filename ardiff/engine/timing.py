"""How long a block's forward took, without a host sync per block on CUDA.

    timer = start_timer(device)           CPU: perf_counter; CUDA: a timing event recorded now
    latency = stop_timer(timer)           a float (CPU), or a DeviceLatency (CUDA)
    seconds(latency)                      the float; a DeviceLatency is read when first asked

On CPU the forward has finished when it returns: the host clock is the latency. On CUDA
it has only been queued: two events bracket it on the current stream, read lazily, by
which time the block's frames have been waited for anyway (the rollout job hands them to
the encoder one block late), so reading costs no extra wait
(docs/design.md#5-runner-and-sessions).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Protocol, Union

if TYPE_CHECKING:  # pragma: no cover - typing only: torch is imported when CUDA is timed
    import torch
    from typing_extensions import Self


class TimingEvent(Protocol):
    """What `torch.cuda.Event(enable_timing=True)` offers (tests pass fakes)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Self) -> float: ...


EventFactory = Callable[[], TimingEvent]


class DeviceLatency:
    """The elapsed time between two recorded CUDA events, read (and kept) on first use.

    `host_s` is the host time the forward took to launch: what is reported instead if the
    events cannot be read (a CUDA error made the context unusable; the job has failed then
    and says so — a latency is no reason to raise a second time)."""

    __slots__ = ("_start", "_end", "_host_s", "_seconds")

    def __init__(self, start: TimingEvent, end: TimingEvent, host_s: float) -> None:
        self._start: TimingEvent | None = start
        self._end: TimingEvent | None = end
        self._host_s = host_s
        self._seconds: float | None = None

    @property
    def seconds(self) -> float:
        if self._seconds is None:
            self._seconds = self._read()
            self._start = self._end = None  # the events are no longer needed
        return self._seconds

    def _read(self) -> float:
        start, end = self._start, self._end
        assert start is not None and end is not None, "the events are dropped once read"
        try:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0  # ms -> s
        except RuntimeError:
            return self._host_s

    @property
    def is_read(self) -> bool:
        return self._seconds is not None


Latency = Union[float, DeviceLatency]


def seconds(latency: Latency) -> float:
    """A latency in seconds (a DeviceLatency is read now if it was not yet)."""
    return latency.seconds if isinstance(latency, DeviceLatency) else latency


class _DeviceTimer:
    __slots__ = ("start", "host_start")

    def __init__(self, start: TimingEvent, host_start: float) -> None:
        self.start, self.host_start = start, host_start


Timer = Union[float, _DeviceTimer]  # what start_timer returns: a host clock reading, or an event


def start_timer(device: torch.device, event_factory: EventFactory | None = None) -> Timer:
    """A running timer: the host clock on CPU; on CUDA an event recorded on the current
    stream (`event_factory`: what makes the events, `torch.cuda.Event` by default)."""
    if device.type != "cuda":
        return time.perf_counter()
    start = _make_event(event_factory)
    start.record()
    return _DeviceTimer(start, time.perf_counter())


def stop_timer(timer: Timer, event_factory: EventFactory | None = None) -> Latency:
    """The latency since `start_timer`; on CUDA an end event is recorded and nothing waits."""
    if not isinstance(timer, _DeviceTimer):
        return time.perf_counter() - timer
    end = _make_event(event_factory)
    end.record()
    return DeviceLatency(timer.start, end, time.perf_counter() - timer.host_start)


def _make_event(event_factory: EventFactory | None) -> TimingEvent:
    if event_factory is not None:
        return event_factory()
    import torch

    event: TimingEvent = torch.cuda.Event(enable_timing=True)
    return event

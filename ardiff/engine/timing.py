"""How long a block's forward took, without a host sync per block on CUDA (DESIGN §5).

    timer = start_timer(device)           CPU: perf_counter; CUDA: a timing event recorded now
    latency = stop_timer(timer)           a float (CPU), or a DeviceLatency (CUDA)
    seconds(latency)                      the float; a DeviceLatency is read when first asked

On CPU the forward has finished when it returns, so the host clock is the latency (as it
always was). On CUDA the forward has only been queued: two events bracket it on the
current stream and their elapsed time is read lazily, by which time the block's frames
have been waited for anyway (the rollout job hands them to the encoder one block late),
so reading it costs no extra wait.
"""

from __future__ import annotations

import time
from typing import Any, Union


class DeviceLatency:
    """The elapsed time between two recorded CUDA events, read (and kept) on first use.

    `host_s` is the host time the forward took to launch: what is reported instead if the
    events cannot be read (a CUDA error made the context unusable; the job has failed then
    and says so — a latency is no reason to raise a second time)."""

    __slots__ = ("_start", "_end", "_host_s", "_seconds")

    def __init__(self, start: Any, end: Any, host_s: float) -> None:
        self._start, self._end, self._host_s = start, end, host_s
        self._seconds: float | None = None

    @property
    def seconds(self) -> float:
        if self._seconds is None:
            try:
                self._end.synchronize()
                self._seconds = self._start.elapsed_time(self._end) / 1000.0  # ms -> s
            except RuntimeError:
                self._seconds = self._host_s
            self._start = self._end = None  # the events are no longer needed
        return self._seconds

    @property
    def is_read(self) -> bool:
        return self._seconds is not None


Latency = Union[float, DeviceLatency]


def seconds(latency: Latency) -> float:
    """A latency in seconds (a DeviceLatency is read now if it was not yet)."""
    return latency if type(latency) is float else latency.seconds


class _DeviceTimer:
    __slots__ = ("start", "host_start")

    def __init__(self, start: Any, host_start: float) -> None:
        self.start, self.host_start = start, host_start


def start_timer(device: Any, event_factory: Any = None) -> Any:
    """A running timer: the host clock on CPU; on CUDA an event recorded on the current
    stream (`event_factory`: what makes the events, `torch.cuda.Event` by default)."""
    if device.type != "cuda":
        return time.perf_counter()
    start = _make_event(event_factory)
    start.record()
    return _DeviceTimer(start, time.perf_counter())


def stop_timer(timer: Any, event_factory: Any = None) -> Latency:
    """The latency since `start_timer`; on CUDA an end event is recorded and nothing waits."""
    if type(timer) is float:
        return time.perf_counter() - timer
    end = _make_event(event_factory)
    end.record()
    return DeviceLatency(timer.start, end, time.perf_counter() - timer.host_start)


def _make_event(event_factory: Any) -> Any:
    if event_factory is not None:
        return event_factory()
    import torch

    return torch.cuda.Event(enable_timing=True)

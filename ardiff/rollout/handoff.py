"""A block's frames handed from the device to the encoder without a host wait per block.

    handoff = make_handoff(runner)        lag 1 on CUDA, 0 on CPU (or the source's frames_lag)
    handoff.push(event)                   stage the block's frames (CUDA: a pinned copy queued)
    for event in handoff.ready(): ...     the blocks beyond the lag, their frames on the host
    for event in handoff.ready(keep=0):   every staged block (the end of the run, a failure)
    for event in handoff.finished():      the staged blocks already on the host (no wait)

On CUDA `push` queues a non-blocking copy into pinned host memory and records an event
behind it; `ready` waits for that event one block later, once the next block is queued
(the one host wait per block). A device error surfaces at that wait: `ready` calls
`fail(session_id, block_index, exc)` (the runner's `fail_block`: the session fails closed,
PipelineError) and drops what was staged after it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

from ardiff.rollout.streams import BlockEvent

if TYPE_CHECKING:  # pragma: no cover - typing only: both import torch
    import torch

    from ardiff.engine.runner import Runner


@dataclass
class Staged:
    """A block on its way to the host: `done` is waited before its frames are read
    (a CUDA event recorded after the copy; None: they are on the host already)."""

    event: BlockEvent
    done: torch.cuda.Event | None = None


def stage_frames(event: BlockEvent) -> Staged:
    """Start copying the block's frames to pinned host memory (CUDA); CPU frames as they are."""
    frames = event.frames
    if not getattr(frames, "is_cuda", False):
        return Staged(event)
    import torch

    host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
    host.copy_(frames, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return Staged(dataclasses.replace(event, frames=host), done)


class FrameHandoff:
    """Staged blocks in order; `lag` of them stay queued behind the newest."""

    def __init__(self, lag: int, fail: Callable[[str, int, BaseException], None],
                 stage: Callable[[BlockEvent], Staged] = stage_frames) -> None:
        self.lag, self._fail, self._stage = lag, fail, stage
        self._queue: deque[Staged] = deque()
        self.failed = False

    def push(self, event: BlockEvent, copy: bool = True) -> None:
        """Queue a block; `copy` False: nothing reads its frames (a CFG rank that does not
        write), so they are not copied."""
        self._queue.append(self._stage(event) if copy else Staged(event))

    def ready(self, keep: int | None = None) -> Iterator[BlockEvent]:
        """The oldest blocks while more than `keep` (default: the lag) are queued, each once
        its frames are on the host. Nothing after a block whose wait failed."""
        keep = self.lag if keep is None else keep
        while len(self._queue) > keep and not self.failed:
            staged = self._queue.popleft()
            if staged.done is not None:
                self._wait(staged)
            yield staged.event

    def finished(self) -> Iterator[BlockEvent]:
        """The oldest blocks whose frames are on the host already, without waiting for the
        device (a takeover's: the device may be what is stuck); stops at the first that is
        not."""
        while self._queue and not self.failed:
            done = self._queue[0].done
            if done is not None and not done.query():
                return
            yield self._queue.popleft().event

    def _wait(self, staged: Staged) -> None:
        assert staged.done is not None, "ready() waits only for a staged copy"
        try:
            staged.done.synchronize()
        except BaseException as exc:  # noqa: BLE001 - a device error: the block failed
            if isinstance(exc, KeyboardInterrupt):  # still to be written: wait again later
                self._queue.appendleft(staged)
                raise
            self.failed = True
            self._queue.clear()
            event = staged.event
            self._fail(event.stream.session_id, event.block_index, exc)
            raise


def frames_lag(device: torch.device) -> int:
    """Blocks a block's frames wait before the encoder gets them: 1 on CUDA, 0 on CPU."""
    return 1 if device.type == "cuda" else 0


def make_handoff(runner: Runner, lag: int | None = None) -> FrameHandoff:
    """The runner's hand-off; `lag` overrides `frames_lag` (a block source that is steered
    by the frames it shows wants 0: `LiveBlocks.frames_lag`)."""
    return FrameHandoff(frames_lag(runner.device) if lag is None else lag, runner.fail_block)

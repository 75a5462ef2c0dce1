"""What a rollout did block by block, for a picture of the run (`ardiff rollout --report`).

    timeline = RunTimeline(thumbnails=8)
    run_rollout(config, on_event=timeline.record)       # or inside another callback
    timeline.latencies_s, .pages_in_use, .rss_bytes      # one value per block
    timeline.thumbnails                                  # [(frame index, uint8 [H, W, 3])]

It keeps a few numbers per block and `thumbnails` frames spread evenly over the
frames the run asked for (their indices are fixed by `frames_total` before the
first block), so its memory does not grow with the frames' size times the length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ardiff.rollout.report import current_rss_bytes

DEFAULT_THUMBNAILS = 8


def thumbnail_indices(frames_total: int, count: int) -> list[int]:
    """`count` frame indices spread evenly over `frames_total` frames, first and last included."""
    if frames_total <= 0 or count <= 0:
        return []
    if count == 1 or frames_total == 1:
        return [0]
    step = (frames_total - 1) / (min(count, frames_total) - 1)
    return sorted({round(i * step) for i in range(min(count, frames_total))})


@dataclass
class RunTimeline:
    """Per-block series of one run; `record` is (or is called by) the job's `on_event`."""

    thumbnails_wanted: int = DEFAULT_THUMBNAILS
    latencies_s: list[float] = field(default_factory=list)
    pages_in_use: list[int | None] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    frames_written: list[int] = field(default_factory=list)
    thumbnails: list[tuple[int, Any]] = field(default_factory=list)  # (index, [H, W, 3] uint8)
    _wanted: list[int] | None = field(default=None, repr=False)

    def record(self, event: Any) -> None:
        """Take one `ProgressEvent`; only `rollout` events (one per block) count."""
        if event.phase != "rollout" or event.block is None:
            return
        if self._wanted is None:
            self._wanted = thumbnail_indices(event.frames_total, self.thumbnails_wanted)
        self.latencies_s.append(event.block.latency_s)
        self.pages_in_use.append(event.pages_in_use)
        self.rss_bytes.append(current_rss_bytes())
        self.frames_written.append(event.frames_written)
        self._keep_thumbnails(event.block.frames, event.frames_written)

    def _keep_thumbnails(self, frames: Any, written: int) -> None:
        first = written - int(frames.shape[0])
        while self._wanted and self._wanted[0] < written:
            index = self._wanted.pop(0)
            self.thumbnails.append((index, _to_numpy(frames[index - first])))

    @property
    def blocks(self) -> int:
        return len(self.latencies_s)


def _to_numpy(frame: Any):
    """A copy of one frame as a numpy array (a torch tensor on any device, or numpy)."""
    if hasattr(frame, "detach"):
        return frame.detach().cpu().numpy().copy()
    return frame.copy()

"""Which committed frames a branch keeps: the window policy (docs/design.md#3-what-a-block-sees).

With sink S, window W and block B frames, a block attends to the first
min(S, n) frames, the most recent W - B other frames, and itself. A branch
therefore keeps exactly what the *next* block will see:

    sliding   keep the last max(0, W - B) non-sink frames after each commit
    tumbling  keep them all while the next block still fits in W; once it
              would not, drop every non-sink frame (the window starts over)

    frames:  | sink (S) |  ...evicted...  | kept (<= W-B) | next block (B) |
             '--- always visible ---'      '------ window W -------------'
"""

from __future__ import annotations

from dataclasses import dataclass

from ardiff.contract.spec import ARDiffusionKVCacheSpec


@dataclass(frozen=True)
class WindowPolicy:
    """Integer rules of the window; shared by the page table and `inspect-spec`."""

    sink_frames: int
    window_frames: int
    frames_per_block: int
    reset_at_boundary: bool = False

    @classmethod
    def from_spec(cls, spec: ARDiffusionKVCacheSpec) -> WindowPolicy:
        return cls(spec.sink_frames, spec.window_frames, spec.frames_per_block,
                   spec.reset_at_boundary)

    @property
    def past_frames(self) -> int:
        """Non-sink history frames a block may attend to."""
        return max(0, self.window_frames - self.frames_per_block)

    def is_sink(self, frame_index: int) -> bool:
        return frame_index < self.sink_frames

    def num_recent_to_keep(self, num_recent: int) -> int:
        """How many of `num_recent` non-sink frames survive a commit."""
        if self.reset_at_boundary:
            fits = num_recent + self.frames_per_block <= self.window_frames
            return num_recent if fits else 0
        return min(num_recent, self.past_frames)

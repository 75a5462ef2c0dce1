"""A session's actions per video frame, as the released streaming demo writes them.

The demo writes each block's action into every video frame of the block (9 for a
session's first block of 3 latent frames, 12 after); a per-latent-frame list writes each
action into that latent frame's video frames (1 for latent frame 0, then 4 each). The
action module reads, for latent frame j, video frames 4j-12 .. 4j-1 (frames before 0
repeat frame 0's action). A track keeps frame 0 and the last `KEEP_VIDEO_FRAMES` frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ardiff.pipelines.matrix_game.action_module import VIDEO_FRAMES_PER_LATENT
from ardiff.pipelines.matrix_game.actions import ActionSpace

KEEP_VIDEO_FRAMES = 64  # more than a block's window of 4 * (window + block) frames


@dataclass
class ActionTrack:
    """Keyboard and mouse vectors of video frames `offset ..` (and of frame 0)."""

    first: tuple[list[float], list[float]] | None = None
    offset: int = 0
    keyboard: list[list[float]] = field(default_factory=list)
    mouse: list[list[float]] = field(default_factory=list)

    @property
    def num_frames(self) -> int:
        return self.offset + len(self.keyboard)

    def write(self, space: ActionSpace, start: int, frames: int,
              actions: Sequence[str] | None) -> None:
        """Write the actions of latent frames start .. start + frames - 1 (one action for
        all, one per latent frame, or None: idle) into their video frames."""
        names = list(actions) if actions else [space.idle]
        self._truncate(_video_start(start))
        for i in range(frames):
            keyboard, mouse = space.vectors(names[i] if len(names) == frames else names[0])
            count = 1 if start + i == 0 else VIDEO_FRAMES_PER_LATENT
            self.keyboard += [keyboard] * count
            self.mouse += [mouse] * count
            if self.first is None:
                self.first = (keyboard, mouse)
        drop = max(0, len(self.keyboard) - KEEP_VIDEO_FRAMES)
        del self.keyboard[:drop], self.mouse[:drop]
        self.offset += drop

    def _truncate(self, video_frame: int) -> None:
        """Forget frames from `video_frame` on (a block written again)."""
        keep = max(0, video_frame - self.offset)
        del self.keyboard[keep:], self.mouse[keep:]

    def windows(self, start: int, frames: int, window: int) -> tuple[torch.Tensor, ...]:
        """(keyboard [frames, 4 * window, keys], mouse [frames, 4 * window * 2]) the action
        module reads for latent frames start .."""
        assert self.first is not None, "write before windows"
        span = VIDEO_FRAMES_PER_LATENT * window
        keyboard, mouse = [], []
        for j in range(start, start + frames):
            first = VIDEO_FRAMES_PER_LATENT * j - span
            rows = [self._frame(f) for f in range(first, first + span)]
            keyboard.append([r[0] for r in rows])
            mouse.append([value for r in rows for value in r[1]])
        return torch.tensor(keyboard), torch.tensor(mouse)

    def _frame(self, index: int) -> tuple[list[float], list[float]]:
        if index <= 0:
            assert self.first is not None
            return self.first
        return self.keyboard[index - self.offset], self.mouse[index - self.offset]


def _video_start(latent_frame: int) -> int:
    return 0 if latent_frame == 0 else 1 + VIDEO_FRAMES_PER_LATENT * (latent_frame - 1)

"""What the pipeline keeps per session besides its KV pages (model-owned state).

    image   its CLIP tokens and encoded image latents (conditioning.ImageCondition)
    track   its actions per video frame (track.ActionTrack)
    kept    per action layer the kept mouse / keyboard K/V of the last window - block frames
The decoder's streaming cache is kept by the decoder, by session id. Dropped on reset, close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ardiff.pipelines.matrix_game.conditioning import ImageCondition
from ardiff.pipelines.matrix_game.track import ActionTrack


@dataclass
class SessionState:
    session_id: str
    image: ImageCondition
    track: ActionTrack = field(default_factory=ActionTrack)
    kept: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors (the action track is a few floats per video frame)."""
        return self.image.nbytes + sum(t.numel() * t.element_size()
                                       for d in self.kept.values() for t in d.values())

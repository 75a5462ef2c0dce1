"""Stage 2's own-rollout history (#34 remedy 3, scheduled sampling / Self-Forcing style): the
model rolls a clip out on its own frames, without gradient, and the next frames are then
trained on that history against the simulator's true frames.

    clip:     [ W-1 true frames | k + NOISY - 1 frames | the last ]       W = window_frames
    history:  [ W-1 true frames | the model's own, frame by frame, each from the W-1
                history frames before it (ROLLOUT_STEPS sampler steps) | true, unseen ]
    noisy:    the last NOISY true frames, each seeing W-1 frames of own history

Only ROLLOUT_SHARE of the clips (rows) take their own history; the rest keep the true one
(teacher forcing in the same batch), which anchors the model to the simulator.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ardiff.pipelines.bouncing.model import BouncingDiT, sample_next
from ardiff.pipelines.bouncing.training.losses import NOISY

MIN_ROLLOUT = 4        # k, the frames rolled out before the first noised copy: 4..max
ROLLOUT_STEPS = 1      # sampler steps per own frame (one is as good as four: README's log)
ROLLOUT_SHARE = 0.5    # the clips that take their own history


def rollout_length(window: int, max_rollout: int, rng: np.random.Generator) -> int:
    """The clip length for k ~ U{MIN_ROLLOUT..max_rollout} own frames before the first
    noised copy: W-1 true frames, then k + NOISY."""
    k = int(rng.integers(MIN_ROLLOUT, max(MIN_ROLLOUT, max_rollout) + 1))
    return window - 1 + k + NOISY


def own_rollout(model: BouncingDiT, clip, gen: torch.Generator):
    """`clip` (drift.Clip, no sink) with the history after its first W-1 frames rolled out by
    the model itself in ROLLOUT_SHARE of its rows; its true frames and actions unchanged."""
    b, length = clip.history.shape[:2]
    seen = model.c.window_frames - 1
    history = clip.history.clone()
    was_training = model.training
    model.eval()
    for p in range(seen, length - 1):   # the last history frame is seen by no noisy copy
        noise = torch.randn(history[:, p].shape, generator=gen)
        frame = sample_next(model, history[:, p - seen:p], clip.actions[:, p - seen:p + 1],
                            int(clip.positions[p - seen]), noise, ROLLOUT_STEPS)
        history[:, p] = frame.clone()   # out of inference mode: a plain tensor for training
    model.train(was_training)
    own = torch.rand(b, generator=gen) < ROLLOUT_SHARE
    return replace(clip, history=torch.where(own[:, None, None, None, None], history,
                                             clip.history))

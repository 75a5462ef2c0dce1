"""Stage 2 of the bouncing world model's training: teacher forcing continued, with the remedies
against drift that ../README.md's experiment log measures, each a switch of `DriftRecipe`:

    window  frames a frame sees (its own included): longer than stage 1's 5 to read motion
            and objects hidden a while from more history; clips grow to hold a full window
    sink    the clip's world's first frame stays visible as a sink (position 0), the clip
            placed 0..MAX_GAP frames after it: as `ardiff rollout` runs with sink_frames: 1,
            the first simulator frame showing every ball's true size and colour. The sink
            shows the balls alone (as the pipeline commits it): a sprite there, far from
            where it went, was copied back into rollouts
    jitter  history frames redrawn, each with probability `jitter`, with every ball's radius
            scaled by up to +-JITTER_SIZE, its colour by up to +-JITTER_COLOUR and the frame
            faded by up to JITTER_FADE (a frame that drifted in looks); targets stay true
    own     history frames replaced, each with probability `own`, by the model's own one-step
            prediction of them from the true frames before (the errors it makes); targets true
    rollout the history rolled out by the model itself over 4..`rollout` frames before the
            first noised copy, in half the clips, without gradient (`rollout.py`); no sink
    context_noise  every history frame noised to its own level drawn from U(0, context_noise),
            the level given to the model (GameNGen's noise augmentation; the model gains its
            `context_level` input); the pipeline then commits history at a small fixed level

    slots:  [ sink? | CLIP history frames (true, jittered or own) | NOISY noised copies of the
              last NOISY true frames ]   under `forward_frames`' block-causal mask

With every switch off it is stage 1's objective (`losses.teacher_forcing_loss`) continued.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

import ardiff
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.model import BouncingDiT, pixels_to_model
from ardiff.pipelines.bouncing.training.losses import (
    AUTOCAST_DTYPE,
    CLIP,
    NOISY,
    noised,
    sample_levels,
    weighted_error,
)
from ardiff.pipelines.bouncing.training.rollout import own_rollout, rollout_length

JITTER_SIZE = 0.15         # a jittered ball's radius x U(1 - this, 1 + this)
JITTER_COLOUR = 0.1        # ... its colour x U(1 - this, 1 + this) per channel
JITTER_FADE = 0.15         # ... the whole frame x U(1 - this, 1)
NEAR_GAPS = 100            # half the clips start 0..NEAR_GAPS-1 frames after the sink,
MAX_GAP = 2_048            # ... half log-uniformly up to MAX_GAP (long played games)


@dataclass(frozen=True)
class DriftRecipe:
    """Which remedies stage 2 trains with (all off: teacher forcing continued)."""

    window: int = 5         # window_frames the model trains (and then runs) with
    sink: bool = False
    jitter: float = 0.0     # probability that a history frame is redrawn jittered
    own: float = 0.0        # probability that it is the model's own one-step prediction
    context_noise: float = 0.0   # history noise levels drawn from U(0, this), given to the model
    rollout: int = 0        # own-rollout history of up to this many frames (0: none)

    def __post_init__(self) -> None:
        if self.rollout and self.sink:
            raise ardiff.ConfigError("--rollout: an own-rollout history is trained without a "
                                     "sink; drop --sink or --rollout")


@dataclass
class Clip:
    """A training clip: true frames [B, L, 3, s, s], the history the model sees in their place
    (and the sink before them when there is one), the actions of every slot and the
    absolute positions of the history slots."""

    true: torch.Tensor
    history: torch.Tensor
    actions: torch.Tensor
    positions: torch.Tensor


def drift_loss(model: BouncingDiT, recipe: DriftRecipe, rng: np.random.Generator,
               gen: torch.Generator, batch: int) -> torch.Tensor:
    """The weighted x0 loss of NOISY noised copies of a fresh clip's last true frames, each
    seeing the history `recipe` makes."""
    length = (rollout_length(recipe.window, recipe.rollout, rng) if recipe.rollout
              else clip_length(recipe))
    clip = make_clip(rng, batch, length, recipe)
    if recipe.own:
        clip = own_history(model, clip, recipe.own, gen)
    if recipe.rollout:
        clip = own_rollout(model, clip, gen)
    b, length = clip.true.shape[:2]
    target = clip.true[:, length - NOISY:]
    t = sample_levels(gen, (b, NOISY))
    slots = clip.history.shape[1]
    positions = torch.cat([clip.positions, clip.positions[slots - NOISY:]])
    is_noisy = torch.zeros(len(positions), dtype=torch.bool)
    is_noisy[slots:] = True
    history, level = clip.history, None
    if recipe.context_noise:
        history_level = recipe.context_noise * torch.rand(b, slots, generator=gen)
        history = noised(history, history_level, gen)
        level = torch.cat([history_level, torch.zeros(b, NOISY)], 1)
    return weighted_error(model, torch.cat([history, noised(target, t, gen)], 1),
                          torch.cat([torch.zeros(b, slots), t], 1),
                          torch.cat([clip.actions, clip.actions[:, slots - NOISY:]], 1),
                          positions, is_noisy, target, t, level)


def with_context_level(model: BouncingDiT) -> BouncingDiT:
    """`model` given the `context_level` input (zero at first: the same predictions), its
    other weights kept; `model` itself when it has one."""
    if model.context_level is not None:
        return model
    grown = BouncingDiT(model.c, context_level=True)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("context_level.") for k in missing), missing
    return grown


def clip_length(recipe: DriftRecipe) -> int:
    """CLIP frames, or enough that the first noised copy sees a full window."""
    return max(CLIP, recipe.window - 1 + NOISY)


def make_clip(rng: np.random.Generator, batch: int, length: int, recipe: DriftRecipe) -> Clip:
    """`batch` fresh simulated clips of `length` frames, jittered and after a sink as
    `recipe` says."""
    actions = sim.random_actions(rng, batch, length)
    state = sim.SimState.sample(rng, batch)
    before: list[np.ndarray] = []
    start = 0
    if recipe.sink:   # the world's first frame, then the clip `gap` frames later
        state = sim.step(state, np.zeros(batch, dtype=np.int64))
        before.append(sim.render(state, sprite=False))
        gap = (int(rng.integers(NEAR_GAPS)) if rng.random() < 0.5
               else int(np.exp(rng.uniform(0, np.log(MAX_GAP)))))
        skipped = sim.random_actions(rng, batch, gap) if gap else np.zeros((batch, 0), np.int64)
        for f in range(gap):
            state = sim.step(state, skipped[:, f])
        start = gap + 1
    true, seen = [], []
    for f in range(length):
        state = sim.step(state, actions[:, f])
        true.append(sim.render(state))
        seen.append(jittered(state, true[-1], recipe.jitter, rng) if recipe.jitter else true[-1])
    history = np.stack(before + seen, 1)
    actions_all = np.concatenate([np.zeros((batch, len(before)), np.int64), actions], 1)
    positions = torch.cat([torch.zeros(len(before), dtype=torch.long),
                           torch.arange(start, start + length)])
    return Clip(pixels_to_model(np.stack(true, 1)), pixels_to_model(history),
                torch.from_numpy(actions_all), positions)


def jittered(state: sim.SimState, frame: np.ndarray, chance: float,
             rng: np.random.Generator) -> np.ndarray:
    """`frame` of `state` [B, 3, s, s], each world's redrawn with probability `chance` with
    its balls' radius and colour scaled and the frame faded (JITTER_*)."""
    b = state.batch
    look = replace(state,
                   radius=state.radius * rng.uniform(1 - JITTER_SIZE, 1 + JITTER_SIZE,
                                                     state.radius.shape),
                   colour=np.clip(state.colour * rng.uniform(1 - JITTER_COLOUR, 1 + JITTER_COLOUR,
                                                             state.colour.shape), 0, 1))
    redrawn = sim.render(look) * rng.uniform(1 - JITTER_FADE, 1, (b, 1, 1, 1))
    pick = rng.random(b) < chance
    return np.where(pick[:, None, None, None], redrawn, frame).astype(np.float32)


@torch.no_grad()
def own_history(model: BouncingDiT, clip: Clip, chance: float, gen: torch.Generator) -> Clip:
    """`clip` with each history frame after the first window (each with probability `chance`)
    replaced by the model's one-step prediction of it from the history before it."""
    b, slots = clip.history.shape[:2]
    positions = torch.cat([clip.positions, clip.positions])
    is_noisy = torch.zeros(2 * slots, dtype=torch.bool)
    is_noisy[slots:] = True
    t = torch.cat([torch.zeros(b, slots), torch.ones(b, slots)], 1)
    noise = torch.randn(clip.history.shape, generator=gen)
    was_training = model.training
    model.eval()
    with torch.autocast("cpu", dtype=AUTOCAST_DTYPE):
        predicted = model.forward_frames(torch.cat([clip.history, noise], 1), t,
                                         torch.cat([clip.actions, clip.actions], 1),
                                         positions, is_noisy)[:, slots:].float().clamp(-1, 1)
    model.train(was_training)
    pick = torch.rand(b, slots, generator=gen) < chance
    pick[:, :slots - clip.true.shape[1] + model.c.window_frames - 1] = False  # sink, first window
    return replace(clip, history=torch.where(pick[..., None, None, None], predicted,
                                             clip.history))

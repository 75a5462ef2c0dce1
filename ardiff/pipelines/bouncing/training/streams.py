"""Self-rollout streams for the training's stage 2 (Self-Forcing style): the model continues
its own rollouts, and each step trains it on the simulator's next frame after a window of
frames *it* generated.

    stream:  [ true context frames ] -> made -> made -> ... (1..12 frames) -> restart
    step:    history (window of made frames), actions, true next frame  -> rollout_loss
"""

from __future__ import annotations

import numpy as np
import torch

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.model import (
    BouncingDiT,
    model_to_pixels,
    pixels_to_model,
    sample_next,
)
from ardiff.pipelines.bouncing.training import locator

# A stream runs 1..12 generated frames, then restarts from true frames. Longer streams
# (8..96 was tried) lose balls the re-sync cannot place, and their targets then ask for
# balls the context does not show: the model learned to blur and ignore it.
ROLLOUT_DEPTH = (1, 13)
# When a ball counts as found cleanly enough to re-sync the world to it (areas and
# spreads are relative to the ball drawn alone).
UNOCCLUDED_AREA = 0.9      # its true frame shows at least this much of it
AREA_RANGE = (0.6, 1.4)    # the generated frame shows about its area ...
MAX_SPREAD = 1.2           # ... as one blob ...
MAX_SHIFT_PX = 4           # ... near where the simulator has it
SPRITE_AREA_TOLERANCE = 0.3  # the sprite is found if its area is within 30% of its size


class Streams:
    """`batch` self-rollouts advanced one frame per step, each with its simulator world.

    After every generated frame the world is re-synced to it: each ball (and the sprite)
    the locator finds cleanly in the generated frame moves to where the model drew it,
    keeping its true velocity, size and colour. The next true frame is then what the
    simulator makes from the model's own positions, so a target never asks the model to
    jump to a position its context does not show -- only to draw what it drew right.
    """

    def __init__(self, model: BouncingDiT, batch: int, rng: np.random.Generator) -> None:
        self.model, self.rng, self.batch = model, rng, batch
        self.context = model.c.window_frames - 1
        length = self.context + ROLLOUT_DEPTH[1]
        self.world = sim.SimState.sample(rng, batch)
        self.actions = sim.random_actions(rng, batch, length)
        self.frame = np.zeros(batch, dtype=np.int64)     # frames made so far per stream
        self.limit = np.zeros(batch, dtype=np.int64)
        self.history = torch.zeros(batch, self.context, 3, sim.SIZE, sim.SIZE)
        self.restart(np.arange(batch))

    def restart(self, rows: np.ndarray) -> None:
        """New worlds in `rows`, their first `context` frames simulated (true history)."""
        fresh = sim.SimState.sample(self.rng, len(rows))
        actions = sim.random_actions(self.rng, len(rows), self.actions.shape[1])
        frames, fresh = sim.simulate(fresh, actions[:, :self.context])
        for name in ("pos", "vel", "radius", "colour", "alive", "sprite"):
            getattr(self.world, name)[rows] = getattr(fresh, name)
        self.actions[rows] = actions
        self.history[torch.from_numpy(rows)] = pixels_to_model(frames)
        self.frame[rows] = self.context
        self.limit[rows] = self.context + self.rng.integers(*ROLLOUT_DEPTH, size=len(rows))

    def window_actions(self) -> torch.Tensor:
        """[B, context + 1] actions of the history frames and of the next frame."""
        offsets = np.arange(-self.context, 1)
        return torch.from_numpy(np.take_along_axis(self.actions, self.frame[:, None] + offsets, 1))

    def advance(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One frame for every stream: (history, actions, true next frame) to train on."""
        history, actions = self.history.clone(), self.window_actions()
        self.world = sim.step(self.world, actions[:, -1].numpy())
        target = pixels_to_model(sim.render(self.world))
        noise = torch.randn(target.shape, generator=gen)
        made = sample_next(self.model.eval(), history, actions, 0, noise, self.model.c.num_steps)
        self.model.train()
        self.history = torch.cat([self.history[:, 1:], made[:, None]], 1)
        self.resync(model_to_pixels(made)[:, None])
        self.frame += 1
        done = np.flatnonzero(self.frame >= self.limit)
        if len(done):
            self.restart(done)
        return history, actions, target

    def resync(self, made: np.ndarray) -> None:
        """Move cleanly found objects of `made` [B, 1, 3, s, s] (pixels in [0, 1]) there."""
        w = self.world
        alone = locator.located_alone(w)
        drawn = locator.locate(sim.render(w)[:, None], w.colour)
        found = locator.locate(made, w.colour)
        area, spread, centre = found.area[:, 0], found.spread[:, 0], found.centre[:, 0]
        clean = (w.alive & (drawn.area[:, 0] >= UNOCCLUDED_AREA * alone.area)
                 & (area >= AREA_RANGE[0] * alone.area) & (area <= AREA_RANGE[1] * alone.area)
                 & (np.nan_to_num(spread, nan=np.inf) <= MAX_SPREAD * alone.spread)
                 & (np.linalg.norm(np.nan_to_num(centre) - w.pos, axis=-1) < MAX_SHIFT_PX))
        low, high = sim.WALL + w.radius[..., None], sim.SIZE - sim.WALL - w.radius[..., None]
        w.pos[clean] = np.clip(centre, low, high)[clean]
        sprite, side = locator.locate_sprite(made), sim.SPRITE_SIDE
        ok = np.abs(sprite.area[:, 0, 0] - side ** 2) <= SPRITE_AREA_TOLERANCE * side ** 2
        corner = np.rint(np.nan_to_num(sprite.centre[:, 0, 0]) - side / 2)
        corner = np.clip(corner, sim.WALL, sim.SIZE - sim.WALL - side)
        w.sprite[ok] = corner[ok].astype(w.sprite.dtype)

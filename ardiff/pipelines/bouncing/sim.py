"""The bouncing-balls world: a batched simulator and its renderer.

    +--------------------------------+   SIZE x SIZE RGB, values in [0, 1]
    |#### grey wall, WALL px thick ##|   1-3 soft-edged balls of distinct palette colours,
    |#    o->          .          # |   constant velocity, reflected by the walls, passing
    |#         []  <- sprite      # |   through each other; a white square sprite moved
    |#                 <-o        # |   SPRITE_STEP px per frame by the action of the frame
    |################################|   (none, left, right, up, down) and stopped by the walls

Frame i of a clip is `render(step(state, action_i))`: every frame, frame 0 included, is moved
by its own action. The state is numpy arrays with a batch axis: `SimState.from_seed(seed)` is
the one world a seed names (the pipeline's start frames), `SimState.sample(rng, n)` a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

SIZE = 32                 # frame side in pixels
WALL = 1                  # wall thickness in pixels: the box interior is [WALL, SIZE - WALL)
WALL_GREY = 0.4
MAX_BALLS = 3
RADIUS_RANGE = (2.5, 4.0)     # px
SPEED_RANGE = (0.6, 1.4)      # px per frame
SPRITE_SIDE = 4               # px
SPRITE_STEP = 2               # px per frame
SPRITE_COLOUR = (1.0, 1.0, 1.0)
ACTIONS = ("none", "left", "right", "up", "down")
ACTION_MOVES = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)])  # (dx, dy) per action
PALETTE = np.array([(1.0, 0.2, 0.2), (0.2, 1.0, 0.3), (0.3, 0.4, 1.0),
                    (1.0, 0.9, 0.2), (1.0, 0.3, 1.0), (0.2, 1.0, 1.0)], dtype=np.float32)
# Bytes of one world's state as float32 (balls: x, y, vx, vy, radius, r, g, b, alive;
# sprite: x, y): what the pipeline keeps per session while it renders start frames.
STATE_BYTES = (MAX_BALLS * 9 + 2) * 4


@dataclass(frozen=True)
class SimState:
    """A batch of worlds. Balls beyond a world's count have `alive` False and are not drawn."""

    pos: np.ndarray        # [B, MAX_BALLS, 2] ball centres (x, y) in px
    vel: np.ndarray        # [B, MAX_BALLS, 2] px per frame
    radius: np.ndarray     # [B, MAX_BALLS]
    colour: np.ndarray     # [B, MAX_BALLS, 3]
    alive: np.ndarray      # [B, MAX_BALLS] bool
    sprite: np.ndarray     # [B, 2] top-left corner (x, y), integer px

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    @classmethod
    def sample(cls, rng: np.random.Generator, batch: int) -> SimState:
        """`batch` random worlds: 1-3 balls with distinct colours, a sprite anywhere."""
        counts = rng.integers(1, MAX_BALLS + 1, size=batch)
        alive = np.arange(MAX_BALLS)[None] < counts[:, None]
        radius = rng.uniform(*RADIUS_RANGE, size=(batch, MAX_BALLS))
        low, high = WALL + radius, SIZE - WALL - radius
        pos = low[..., None] + rng.random((batch, MAX_BALLS, 2)) * (high - low)[..., None]
        angle = rng.uniform(0, 2 * np.pi, size=(batch, MAX_BALLS))
        speed = rng.uniform(*SPEED_RANGE, size=(batch, MAX_BALLS))
        vel = np.stack([np.cos(angle), np.sin(angle)], axis=-1) * speed[..., None]
        colour = PALETTE[np.argsort(rng.random((batch, len(PALETTE))), axis=1)[:, :MAX_BALLS]]
        sprite = rng.integers(WALL, SIZE - WALL - SPRITE_SIDE + 1, size=(batch, 2))
        return cls(pos, vel, radius, colour, alive, sprite)

    @classmethod
    def from_seed(cls, seed: int) -> SimState:
        """The single world named by `seed` (the pipeline's start frames)."""
        return cls.sample(np.random.default_rng([seed, 0x5EED]), 1)


def step(state: SimState, actions: np.ndarray) -> SimState:
    """Advance every world one frame; `actions` [B] are indices into ACTIONS."""
    low, high = WALL + state.radius[..., None], SIZE - WALL - state.radius[..., None]
    pos, vel = state.pos + state.vel, state.vel.copy()
    below, above = pos < low, pos > high
    pos = np.where(below, 2 * low - pos, np.where(above, 2 * high - pos, pos))
    vel[below | above] *= -1
    sprite = state.sprite + SPRITE_STEP * ACTION_MOVES[np.asarray(actions)]
    sprite = np.clip(sprite, WALL, SIZE - WALL - SPRITE_SIDE)
    return replace(state, pos=pos, vel=vel, sprite=sprite)


PIXEL_CENTRES = np.arange(SIZE, dtype=np.float32) + 0.5  # along either axis, in px


def render(state: SimState) -> np.ndarray:
    """[B, 3, SIZE, SIZE] float32 frames in [0, 1]: wall, balls in order, the sprite on top."""
    b = state.batch
    frames = np.zeros((b, 3, SIZE, SIZE), dtype=np.float32)
    inside = (PIXEL_CENTRES > WALL) & (PIXEL_CENTRES < SIZE - WALL)
    frames[:, :, ~(inside[:, None] & inside[None])] = WALL_GREY
    for i in range(MAX_BALLS):
        dx = PIXEL_CENTRES[None, None, :] - state.pos[:, i, 0, None, None]
        dy = PIXEL_CENTRES[None, :, None] - state.pos[:, i, 1, None, None]
        dist = np.sqrt(dx * dx + dy * dy)  # [B, SIZE, SIZE]
        alpha = np.clip(state.radius[:, i, None, None] + 0.5 - dist, 0.0, 1.0)
        alpha = (alpha * state.alive[:, i, None, None])[:, None]
        frames = frames * (1 - alpha) + alpha * state.colour[:, i, :, None, None]
    left, top = state.sprite[:, :1], state.sprite[:, 1:]  # [B, 1] each
    cols = (PIXEL_CENTRES[None] >= left) & (PIXEL_CENTRES[None] < left + SPRITE_SIDE)
    rows = (PIXEL_CENTRES[None] >= top) & (PIXEL_CENTRES[None] < top + SPRITE_SIDE)
    square = (rows[:, :, None] & cols[:, None, :])[:, None]
    colour = np.array(SPRITE_COLOUR, dtype=np.float32)[None, :, None, None]
    return np.where(square, colour, frames).astype(np.float32)


def random_actions(rng: np.random.Generator, batch: int, frames: int,
                   max_hold: int = 8) -> np.ndarray:
    """[B, frames] action indices: each action held for 1..max_hold frames, all equally likely."""
    out = np.empty((batch, frames), dtype=np.int64)
    for b in range(batch):
        f = 0
        while f < frames:
            hold = int(rng.integers(1, max_hold + 1))
            out[b, f:f + hold] = rng.integers(len(ACTIONS))
            f += hold
    return out


def simulate(state: SimState, actions: np.ndarray) -> tuple[np.ndarray, SimState]:
    """Frames [B, F, 3, SIZE, SIZE] for actions [B, F], and the state after the last one."""
    frames = []
    for f in range(actions.shape[1]):
        state = step(state, actions[:, f])
        frames.append(render(state))
    return np.stack(frames, axis=1), state

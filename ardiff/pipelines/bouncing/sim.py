"""The bouncing-balls world: a batched simulator and its renderer.

    +--------------------------------+   SIZE x SIZE RGB, values in [0, 1]
    |#### grey wall, WALL px thick ##|   1-3 soft-edged balls of distinct palette colours,
    |#    o->          .          # |   constant velocity, reflected by the walls, passing
    |#         []  <- sprite      # |   through each other; a white square sprite moved
    |#                 <-o        # |   SPRITE_STEP px per frame by the action of the frame
    |################################|   (none, left, right, up, down) and stopped by the walls

Frame i of a clip is `render(step(state, action_i))`: every frame, frame 0 included, is moved
by its own action. The state is numpy arrays with a batch axis: `SimState.from_seed(seed)` is
the one world a seed names (the pipeline's start frames: a player's first game), its sprite
clear of every ball (`clear_start`); `SimState.sample(rng, n)` a batch (training data).
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
START_CLEAR_FRAMES = 8     # a seed's world starts with its sprite, standing still, clear
START_GAP_PX = 8.0         # of every ball by this many px for this many frames (clear_start):
                           # moved SPRITE_STEP px a frame, it reaches none in 4 start frames
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
        """The single world named by `seed` (the pipeline's start frames), its sprite clear
        of every ball (`clear_start`: a sprite drawn on a ball is soon merged into it)."""
        rng = np.random.default_rng([seed, 0x5EED])
        return clear_start(cls.sample(rng, 1), rng)


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


SPRITE_CORNERS = np.stack(np.meshgrid(np.arange(WALL, SIZE - WALL - SPRITE_SIDE + 1),
                                      np.arange(WALL, SIZE - WALL - SPRITE_SIDE + 1)),
                          axis=-1).reshape(-1, 2)  # [C, 2] every place the sprite fits


def clear_start(state: SimState, rng: np.random.Generator) -> SimState:
    """`state` with each sprite that a ball comes within START_GAP_PX of in the first
    START_CLEAR_FRAMES frames (the sprite standing still) moved to a random place that
    no ball comes as near, or, where there is none, to the place they come least near.
    A sprite already clear stays (its world is unchanged)."""
    gaps = sprite_gaps(state, SPRITE_CORNERS, START_CLEAR_FRAMES)   # [B, C]
    sprite = state.sprite.copy()
    for b in range(state.batch):
        here = np.flatnonzero((SPRITE_CORNERS == sprite[b]).all(axis=1))[0]
        if gaps[b, here] >= START_GAP_PX:
            continue
        clear = np.flatnonzero(gaps[b] >= START_GAP_PX)
        best = clear[rng.integers(len(clear))] if len(clear) else int(np.argmax(gaps[b]))
        sprite[b] = SPRITE_CORNERS[best]
    return replace(state, sprite=sprite)


def sprite_gaps(state: SimState, corners: np.ndarray, frames: int) -> np.ndarray:
    """[B, C]: the least distance in px between a sprite with top-left `corners` [C, 2] and
    the edge of a live ball, over the start and `frames` steps (negative: they overlap)."""
    paths = [state.pos]
    for _ in range(frames):
        state = step(state, np.zeros(state.batch, dtype=np.int64))
        paths.append(state.pos)
    centres = np.stack(paths, axis=1)[:, :, None, :, :]               # [B, F, 1, balls, 2]
    low = corners[None, None, :, None, :].astype(np.float32)         # [1, 1, C, 1, 2]
    outside = np.maximum(np.maximum(low - centres, centres - (low + SPRITE_SIDE)), 0)
    gaps = np.linalg.norm(outside, axis=-1) - state.radius[:, None, None, :]
    gaps = np.where(state.alive[:, None, None, :], gaps, np.inf)      # [B, F, C, balls]
    return gaps.min(axis=(1, 3))


PIXEL_CENTRES = np.arange(SIZE, dtype=np.float32) + 0.5  # along either axis, in px


def render(state: SimState, sprite: bool = True) -> np.ndarray:
    """[B, 3, SIZE, SIZE] float32 frames in [0, 1]: wall, balls in order, the sprite on top
    (`sprite=False`: the balls alone, as the model's sink frame shows them)."""
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
    if not sprite:
        return frames.astype(np.float32)
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

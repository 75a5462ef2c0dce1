"""Measure the bouncing world's objects back out of frames, simulated or generated, by colour.

A ball is found as the pixels close to its colour: their count (area), centroid and
spread. The evaluation scores generated rollouts with it, and the tests check the sprite's
moves with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ardiff.pipelines.bouncing.sim import (
    MAX_BALLS,
    PIXEL_CENTRES,
    SIZE,
    SPRITE_COLOUR,
    SimState,
    render,
)

COLOUR_TOLERANCE = 0.3    # RGB distance under which a pixel counts as an object's colour


@dataclass(frozen=True)
class Located:
    """Objects found by colour in frames: pixel count, centroid and spread per object."""

    area: np.ndarray       # [..., objects] pixels with the object's colour
    centre: np.ndarray     # [..., objects, 2] (x, y) centroid; NaN where area is 0
    spread: np.ndarray     # [..., objects] RMS distance of those pixels from the centroid


def locate(frames: np.ndarray, colours: np.ndarray) -> Located:
    """Measure objects by colour. frames [B, F, 3, H, W] in [0, 1]; colours [B, K, 3].

    A pixel belongs to an object when its RGB distance to the object's colour is
    under COLOUR_TOLERANCE (soft edges and faded colours fall outside). A ball drawn
    alone has spread ~0.7 x radius; scattered pixels of its colour have a large one.
    """
    diff = frames[:, :, None] - colours[:, None, :, :, None, None]  # [B, F, K, 3, H, W]
    mask = (np.sqrt((diff * diff).sum(axis=3)) < COLOUR_TOLERANCE).astype(np.float32)
    area = mask.sum(axis=(-1, -2))
    xs, ys = PIXEL_CENTRES[None, :], PIXEL_CENTRES[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        cx = (mask * xs).sum(axis=(-1, -2)) / area
        cy = (mask * ys).sum(axis=(-1, -2)) / area
        square = (mask * ((xs - cx[..., None, None]) ** 2 + (ys - cy[..., None, None]) ** 2))
        spread = np.sqrt(square.sum(axis=(-1, -2)) / area)
    return Located(area, np.stack([cx, cy], axis=-1), spread)


def located_alone(state: SimState) -> Located:
    """What `locate` measures for each ball drawn alone (no other ball, no sprite):
    area and spread [B, MAX_BALLS] (zero for balls that are not alive)."""
    area = np.zeros(state.radius.shape, dtype=np.float32)
    spread = np.zeros(state.radius.shape, dtype=np.float32)
    centre = np.zeros(state.pos.shape, dtype=np.float32)
    for i in range(MAX_BALLS):
        only_i = np.eye(MAX_BALLS, dtype=bool)[i][None].repeat(state.batch, 0)
        alone = replace(state, alive=only_i, sprite=np.full_like(state.sprite, -SIZE))
        found = locate(render(alone)[:, None], state.colour[:, i:i + 1])
        area[:, i], spread[:, i] = found.area[:, 0, 0], found.spread[:, 0, 0]
        centre[:, i] = found.centre[:, 0, 0]
    return Located(area * state.alive, centre, np.nan_to_num(spread) * state.alive)


def locate_sprite(frames: np.ndarray) -> Located:
    """`locate` of the sprite in frames [B, F, 3, H, W]: one object per clip, its colour."""
    colour = np.array(SPRITE_COLOUR, dtype=np.float32)
    return locate(frames, np.broadcast_to(colour, (frames.shape[0], 1, len(colour))))

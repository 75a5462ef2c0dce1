"""The long-horizon number: does a long rollout still look like the world?

    HORIZON_WORLDS games of HORIZON_FRAMES frames (worlds 0.., a player's keys), every
    HORIZON_EVERY-th frame scored: it looks like the world when it shows
      - 1 to MAX_BALLS ball-shaped objects: the connected pixels of one palette colour
        (the locator's tolerance), each within AREA_RATIO of the area of one of the world's
        true balls (drawn alone) and about as compact as a disc (spread <= DISC_SPREAD x
        a disc's of that area); specks under MIN_OBJECT_PX are not objects
      - and the sprite (white pixels keeping a quarter of its area, `evaluate.sprite_shown`)
    horizon_share  the share of scored frames that look like the world

A ball swollen into a blob, balls merged into one of the same colour, colour noise and a
lost sprite all score as lost. Balls pass under each other and the sprite, so the simulator
scores a little under 1 (reported beside it).
"""

from __future__ import annotations

import numpy as np

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.training import locator

HORIZON_WORLDS = 8
HORIZON_FRAMES = 2_000
HORIZON_EVERY = 50          # frames 50, 100, ... (1-based) are scored
AREA_RATIO = 1.5            # an object's area within [A / this, A * this] of a true ball's A
DISC_SPREAD = 1.3           # ... and its spread at most this x a disc's of its area
MIN_OBJECT_PX = 4           # smaller specks of a colour are not counted as objects
NEIGHBOURS = ((0, 1), (0, -1), (1, 0), (-1, 0))   # 4-connectivity


def scored_frames(frames: int) -> np.ndarray:
    """The 0-based indices of the frames a game of `frames` frames is scored at."""
    return np.arange(HORIZON_EVERY - 1, frames, HORIZON_EVERY)


def components(mask: np.ndarray) -> np.ndarray:
    """Connected components (4-neighbours) of masks [N, H, W] bool -> labels [N, H, W]:
    0 off the mask, else the largest flat index + 1 of the component's pixels."""
    n, h, w = mask.shape
    labels = np.where(mask, np.arange(1, h * w + 1).reshape(1, h, w), 0)
    while True:
        padded = np.pad(labels, ((0, 0), (1, 1), (1, 1)))
        grown = labels.copy()
        for dy, dx in NEIGHBOURS:
            grown = np.maximum(grown, padded[:, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w])
        grown = np.where(mask, grown, 0)
        if np.array_equal(grown, labels):
            return labels
        labels = grown


def objects(frames: np.ndarray) -> list[list[tuple[float, float]]]:
    """The objects of each frame [N, 3, H, W] in [0, 1]: per frame a list of (area, spread)
    of every connected patch of one palette colour of at least MIN_OBJECT_PX pixels."""
    diff = frames[:, None] - sim.PALETTE[None, :, :, None, None]      # [N, P, 3, H, W]
    masks = np.sqrt((diff * diff).sum(axis=2)) < locator.COLOUR_TOLERANCE
    n, p, h, w = masks.shape
    labels = components(masks.reshape(n * p, h, w)).reshape(n, p, h * w)
    ys, xs = np.divmod(np.arange(h * w), w)
    out: list[list[tuple[float, float]]] = []
    for frame in labels:
        found_here = []
        for label in np.unique(frame[frame > 0]):
            _, pixels = np.nonzero(frame == label)
            if len(pixels) < MIN_OBJECT_PX:
                continue
            spread = np.sqrt(xs[pixels].var() + ys[pixels].var())
            found_here.append((float(len(pixels)), float(spread)))
        out.append(found_here)
    return out


def looks_like_world(frames: np.ndarray, ball_areas: list[np.ndarray],
                     sprite_shown: np.ndarray) -> np.ndarray:
    """[N] bool: frames [N, 3, H, W] that show 1..MAX_BALLS ball-shaped objects, each within
    AREA_RATIO of one of that frame's world's `ball_areas` (true areas of its live balls), and
    the sprite (`sprite_shown` [N] bool)."""
    ok = np.zeros(len(frames), dtype=bool)
    for i, found in enumerate(objects(frames)):
        areas = ball_areas[i]
        ok[i] = bool(sprite_shown[i]) and 1 <= len(found) <= sim.MAX_BALLS and all(
            _is_ball(area, spread, areas) for area, spread in found)
    return ok


def _is_ball(area: float, spread: float, true_areas: np.ndarray) -> bool:
    disc_spread = np.sqrt(area / (2 * np.pi))      # RMS radius of a disc of that area
    sized = ((true_areas / AREA_RATIO <= area) & (area <= true_areas * AREA_RATIO)).any()
    return bool(sized) and spread <= DISC_SPREAD * disc_spread

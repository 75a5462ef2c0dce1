"""The long-horizon share (`training/horizon.py`) on simulated frames: the simulator's frames
look like the world; a blob, colour noise or a lost sprite score as lost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.training import horizon, locator
from ardiff.pipelines.bouncing.training.evaluate import sprite_shown, worlds_of

SEEDS = [0, 1, 2, 5]


def score(frames: np.ndarray, state: sim.SimState) -> np.ndarray:
    areas = locator.located_alone(state).area
    live = [areas[b][state.alive[b]] for b in range(state.batch)]
    return horizon.looks_like_world(frames, live, sprite_shown(frames[:, None])[:, 0])


def test_the_simulators_frames_look_like_the_world():
    state = worlds_of(SEEDS)
    assert score(sim.render(state), state).all()


def test_a_ball_swollen_into_a_blob_scores_as_lost():
    state = worlds_of(SEEDS)
    blob = replace(state, radius=state.radius * 1.8)
    assert not score(sim.render(blob), state).any()


def test_colour_noise_scores_as_lost():
    state = worlds_of(SEEDS)
    noise = np.random.default_rng(0).random((len(SEEDS), 3, sim.SIZE, sim.SIZE), np.float32)
    assert not score(noise, state).any()
    magenta_cyan = sim.render(state)
    magenta_cyan[:, :, ::2] = sim.PALETTE[4][:, None, None]   # stripes of ball colours
    magenta_cyan[:, :, 1::2] = sim.PALETTE[5][:, None, None]
    assert not score(magenta_cyan, state).any()


def test_a_lost_sprite_or_lost_balls_score_as_lost():
    state = worlds_of(SEEDS)
    assert not score(sim.render(state, sprite=False), state).any()
    no_balls = replace(state, alive=np.zeros_like(state.alive))
    assert not score(sim.render(no_balls), state).any()


def test_every_50th_frame_is_scored():
    assert horizon.scored_frames(2000).tolist() == list(range(49, 2000, 50))
    assert len(horizon.scored_frames(2000)) == 40 and len(horizon.scored_frames(49)) == 0


def test_components_are_4_connected():
    mask = np.zeros((1, 4, 4), dtype=bool)
    mask[0, 0, 0] = mask[0, 1, 1] = True        # diagonal: two components
    mask[0, 3, 1:4] = True                      # a row: one
    labels = horizon.components(mask)
    assert len(np.unique(labels[labels > 0])) == 3

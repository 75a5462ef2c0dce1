"""`python -m ardiff.pipelines.bouncing.training.games`: the steered sprite's survival in
games played as `ardiff play` plays them. The visibility score on simulated frames (every
frame shows the sprite; a sprite that vanishes, or shows up only somewhere else, does
not), and the games through ardiff's runtime, run small."""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

import numpy as np
import pytest

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.training import games

pytestmark = pytest.mark.usefixtures("restore_threads")


def simulated(seed: int, actions: list[str]) -> tuple[sim.SimState, np.ndarray]:
    ids = np.array([[sim.ACTIONS.index(name) for name in actions]])
    return sim.SimState.from_seed(seed), sim.simulate(sim.SimState.from_seed(seed), ids)[0]


def test_players_hold_a_direction_then_let_go():
    actions = games.player_actions(np.random.default_rng(0), 400)
    runs = [(name, len(list(run))) for name, run in groupby(actions)]
    assert len(actions) == 400 and {name for name, _ in runs} == {"none", *games.DIRECTIONS}
    for (name, length), (after, _) in zip(runs[:-1], runs[1:]):   # the last may be cut short
        if name == "none":
            assert 1 <= length <= 8 and after in games.DIRECTIONS
        else:
            assert 2 <= length <= 8 and after in ("none", *games.DIRECTIONS)


def test_the_simulator_always_shows_the_sprite_and_a_lost_one_scores_as_lost():
    seeds, actions = [3, 4], [games.player_actions(np.random.default_rng(s), 40) for s in (3, 4)]
    corners = games.sprite_corners(seeds, actions)
    frames = np.concatenate([simulated(s, a)[1] for s, a in zip(seeds, actions)])
    assert games.sprite_visible(frames, corners).all()

    gone = frames.copy()
    world = replace(sim.SimState.from_seed(3), sprite=np.full((1, 2), -sim.SIZE))
    gone[0, 20:] = sim.render(world)            # from frame 20 on: no sprite at all
    moved = corners.copy()
    moved[1, 30:] = (corners[1, 30:] + 12) % 20 + 2  # a sprite elsewhere is not the steered one
    visible = games.sprite_visible(gone, moved)
    assert visible[0, :20].all() and not visible[0, 20:].any()
    assert visible[1, :30].all() and not visible[1, 30:].any()


def test_games_run_through_the_runtime():
    metrics = games.playability(games=1, frames=8)
    assert metrics["games"] == 1 and metrics["frames"] == 8
    for name in ("sprite_visible_frames", "sprite_visible_at_end", "games_losing_it_early",
                 "games_never_losing_it"):
        assert 0 <= metrics[name] <= 1
    assert len(games.report(metrics).splitlines()) == 5


def test_the_recorded_start_frames_are_the_simulators():
    actions = [games.player_actions(np.random.default_rng(0), 6)]
    video = games.play_games([28], actions, ["pipeline.args.num_steps=1"])
    start = simulated(28, actions[0])[1]
    assert video.shape == (1, 6, 3, sim.SIZE, sim.SIZE)
    assert np.abs(video[0, :4] - start[0, :4]).max() <= 1 / 255 + 1e-6
    assert games.sprite_visible(start, games.sprite_corners([28], actions))[0].all()

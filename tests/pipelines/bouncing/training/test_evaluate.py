"""`python -m ardiff.pipelines.bouncing.evaluate`, the command that prints the world model's
numbers (ardiff/pipelines/bouncing/README.md): its scores on simulated frames (every
simulator frame shows its sprite and keeps its balls; a sprite or ball that vanishes scores
as vanished), and the same code path (worlds through ardiff's runner and paged cache,
batched) run small: 2 games of 32 frames and 16 clips instead of 64 x 96 and 256."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from numerics import assert_video_close

import ardiff
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.training import evaluate

pytestmark = pytest.mark.usefixtures("restore_threads")


def without_sprite(state: sim.SimState) -> np.ndarray:
    """The worlds' frames with the sprite moved off the picture."""
    return sim.render(replace(state, sprite=np.full_like(state.sprite, -sim.SIZE)))


def test_a_world_has_the_same_game_in_any_range_of_worlds():
    _, _, actions, frames = evaluate.player_games(4, 12)
    seeds, _, later, later_frames = evaluate.player_games(2, 12, first=2)
    assert seeds == [2, 3] and np.array_equal(later, actions[2:])
    assert np.array_equal(later_frames, frames[2:])


def test_games_are_the_worlds_rollout_starts_from_with_a_players_keys():
    seeds, state, actions, frames = evaluate.player_games(3, 40)
    assert seeds == [0, 1, 2] and actions.shape == (3, 40) and frames.shape == (3, 40, 3, 32, 32)
    assert np.array_equal(state.sprite[1], sim.SimState.from_seed(1).sprite[0])
    again = evaluate.player_games(3, 40)
    assert np.array_equal(again[2], actions) and np.array_equal(again[3], frames)


def test_the_simulator_shows_its_sprite_in_every_frame():
    seeds, _, actions, frames = evaluate.player_games(4, 48)
    assert evaluate.sprite_shown(frames).all()
    numbers = evaluate.sprite_numbers(frames, seeds, actions, context=4)
    assert numbers == {"sprite_visible_frames": 1.0, "sprite_visible_at_end": 1.0,
                       "sprite_in_place_frames": 1.0, "sprite_in_place_at_end": 1.0}


def test_a_sprite_that_vanishes_or_fades_scores_as_vanished():
    seeds, state, actions, frames = evaluate.player_games(2, 40)
    lost = frames.copy()
    _, after = sim.simulate(replace(state), actions[:, :19])
    lost[0, 20:] = without_sprite(sim.step(after, actions[:, 19]))[0]   # gone from frame 20
    lost[1, 30:] *= 0.7                                                  # faded to grey at 30
    shown = evaluate.sprite_shown(lost)
    assert shown[0, :20].all() and not shown[0, 20:].any()
    assert shown[1, :30].all() and not shown[1, 30:].any()
    numbers = evaluate.sprite_numbers(lost, seeds, actions, context=4)
    assert numbers["sprite_visible_frames"] == pytest.approx((16 + 26) / 72)
    assert numbers["sprite_visible_at_end"] == 0.0
    assert numbers["sprite_in_place_frames"] == pytest.approx((16 + 26) / 72)


def test_a_shrunk_sprite_counts_while_it_keeps_a_quarter_of_its_area():
    _, _, _, frames = evaluate.player_games(1, 4)
    white = np.all(frames[0, -1] == 1.0, axis=0)                  # the sprite's 16 pixels
    rows, cols = np.nonzero(white)
    for kept, shown in ((4, True), (3, False)):
        frame = frames[:, -1:].copy()
        for r, c in list(zip(rows, cols))[kept:]:
            frame[0, 0, :, r, c] = 0.0
        assert evaluate.sprite_shown(frame)[0, 0] == shown


def test_a_sprite_elsewhere_is_visible_but_not_in_place():
    seeds, state, actions, frames = evaluate.player_games(1, 12)
    moved = frames.copy()
    corner = state.sprite[0]
    far = np.array([sim.SIZE - 6 if corner[0] < 16 else 2, corner[1]])
    _, end = sim.simulate(replace(state), actions[:, :11])
    moved[0, 11] = sim.render(replace(sim.step(end, actions[:, 11]), sprite=far[None]))[0]
    numbers = evaluate.sprite_numbers(moved, seeds, actions, context=4)
    assert numbers["sprite_visible_at_end"] == 1.0 and numbers["sprite_in_place_at_end"] == 0.0


def test_balls_kept_counts_a_ball_that_vanishes_as_lost():
    _, state, _, frames = evaluate.player_games(8, 30)
    assert evaluate.balls_kept(frames, state, 30) > 0.85          # the simulator keeps them
    lost = frames.copy()
    lost[:, 20:] = 0.0                                            # every ball gone from frame 20
    assert evaluate.balls_kept(lost, state, 30) == 0.0


def test_evaluate_prints_every_number_from_the_runtime():
    metrics = evaluate.evaluate(worlds=2, clips=16, frames=32, horizon_worlds=1,
                                horizon_frames=50)
    assert metrics["num_steps"] == 4 and metrics["worlds"] == 2 and metrics["frames"] == 32
    assert 0 < metrics["next_frame_mse_sampled"] < metrics["copy_last_frame_mse"] / 2
    assert 0 < metrics["ball_position_error_px"] <= evaluate.MISSING_PX
    assert 0 <= metrics["sprite_position_error_px"] <= evaluate.MISSING_PX
    for name in ("sprite_visible_frames", "sprite_visible_at_end", "balls_kept_30"):
        assert 0 <= metrics[name] <= 1
    assert metrics["sim_balls_kept_30"] > 0.5 and "balls_kept_96" not in metrics
    assert metrics["horizon_worlds"] == 1 and metrics["sim_horizon_share"] == 1.0
    assert metrics["horizon_share"] in (0.0, 1.0)           # one scored frame
    lines = evaluate.report(metrics).splitlines()
    assert lines[0].split()[:3] == ["games", "2", "worlds"] and len(lines) == 12
    assert lines[-1].startswith("long horizon (1 x 50 frames)")


def test_batched_games_are_the_one_session_games():
    """Batched rows may take other kernels than one row alone: within the video bound."""
    seeds, _, actions, _ = evaluate.player_games(3, 12)
    batched = evaluate.runtime_rollouts(None, seeds, actions, rows=2)
    alone = evaluate.runtime_rollouts(None, seeds, actions, rows=1)
    assert_video_close(batched, alone, "3 games batched 2 a forward vs alone")


def test_pipeline_args_reach_the_runtime():
    one = evaluate.evaluate(worlds=1, clips=4, frames=16, horizon_worlds=0, num_steps=1)
    assert one["num_steps"] == 1
    four = evaluate.evaluate(worlds=1, clips=4, frames=16, horizon_worlds=0)
    assert one["next_frame_mse_sampled"] != four["next_frame_mse_sampled"]
    assert one["ball_position_error_px"] != four["ball_position_error_px"]


def test_set_names_a_pipeline_arg():
    assert evaluate.pipeline_arg("window_frames=6") == ("window_frames", 6)
    with pytest.raises(ardiff.ConfigError, match=r"--set: 'windows=6' is not FIELD=VALUE"):
        evaluate.pipeline_arg("windows=6")


@pytest.mark.slow  # a fresh interpreter: the command lives at its old module path
def test_it_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "ardiff.pipelines.bouncing.evaluate", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--num-steps" in result.stdout and "--worlds" in result.stdout

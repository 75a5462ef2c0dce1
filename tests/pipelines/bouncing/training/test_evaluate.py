"""`python -m ardiff.pipelines.bouncing.evaluate`, the command that prints the world model's
numbers (ardiff/pipelines/bouncing/README.md), run small: the same code path (held-out worlds
through ardiff's runner and paged cache) on 2 episodes and 16 clips instead of 64 and 256."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ardiff.pipelines.bouncing.training import evaluate


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)   # the pipeline sets one thread while it runs


def test_evaluate_prints_every_readme_number():
    metrics = evaluate.evaluate(episodes_count=2, clips=16)
    assert metrics["num_steps"] == 4
    assert 0 < metrics["next_frame_mse_sampled"] < metrics["copy_last_frame_mse"] / 2
    assert 0 < metrics["ball_position_error_px"] <= evaluate.MISSING_PX
    assert 0 <= metrics["sprite_position_error_px"] <= evaluate.MISSING_PX
    for n in evaluate.KEPT_AT:
        assert 0 <= metrics[f"balls_kept_{n}"] <= 1
        assert metrics[f"sim_balls_kept_{n}"] > 0.5   # the simulator keeps its balls
    lines = evaluate.report(metrics).splitlines()
    assert len(lines) == 6 + len(evaluate.KEPT_AT)
    assert lines[0].split()[-1] == "4"


def test_pipeline_args_reach_the_runtime():
    one = evaluate.evaluate(episodes_count=1, clips=4, num_steps=1)
    assert one["num_steps"] == 1
    four = evaluate.evaluate(episodes_count=1, clips=4)
    assert one["next_frame_mse_sampled"] != four["next_frame_mse_sampled"]
    assert one["ball_position_error_px"] != four["ball_position_error_px"]


@pytest.mark.slow  # a fresh interpreter: the command lives at its old module path
def test_it_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "ardiff.pipelines.bouncing.evaluate", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--num-steps" in result.stdout

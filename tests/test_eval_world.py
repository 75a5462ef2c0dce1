"""examples/eval_world.py, the script that prints the world model's README numbers, run
small: the same code path (held-out worlds through ardiff's runner and paged cache) on
2 episodes and 16 clips instead of 64 and 256."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "eval_world.py"


@pytest.fixture(scope="module")
def eval_world():
    spec = importlib.util.spec_from_file_location("eval_world", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)   # the pipeline sets one thread while it runs


def test_evaluate_prints_every_readme_number(eval_world):
    metrics = eval_world.evaluate(episodes_count=2, clips=16)
    assert metrics["num_steps"] == 4
    assert 0 < metrics["next_frame_mse_sampled"] < metrics["copy_last_frame_mse"] / 2
    assert 0 < metrics["ball_position_error_px"] <= eval_world.MISSING_PX
    assert 0 <= metrics["sprite_position_error_px"] <= eval_world.MISSING_PX
    for n in eval_world.KEPT_AT:
        assert 0 <= metrics[f"balls_kept_{n}"] <= 1
        assert metrics[f"sim_balls_kept_{n}"] > 0.5   # the simulator keeps its balls
    lines = eval_world.report(metrics).splitlines()
    assert len(lines) == 6 + len(eval_world.KEPT_AT)
    assert lines[0].split()[-1] == "4"


def test_pipeline_args_reach_the_runtime(eval_world):
    one = eval_world.evaluate(episodes_count=1, clips=4, num_steps=1)
    assert one["num_steps"] == 1
    four = eval_world.evaluate(episodes_count=1, clips=4)
    assert one["next_frame_mse_sampled"] != four["next_frame_mse_sampled"]
    assert one["ball_position_error_px"] != four["ball_position_error_px"]

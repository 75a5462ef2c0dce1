"""examples/plugin_world_model.py, loaded by file path as a user's plugin: paged = dense,
actions matter, and configs/plugin-world.yaml runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import ardiff
from ardiff.config.run import load_config
from ardiff.engine.build import build_runner
from ardiff.engine.runner import Runner

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "plugin_world_model.py"
CONFIG = REPO / "configs" / "plugin-world.yaml"


def world_runner(tmp_path: Path, backend: str = "paged", **args) -> Runner:
    config = {"pipeline": {"entry": f"{EXAMPLE}:ActionWorldModel",
                           "args": {"size": 8, "patch": 4, "dim": 32, "window_frames": 4,
                                    "num_steps": 2, "upscale": 1, **args}},
              "runtime": {"memory_budget": "64MiB",
                          "kv": {"backend": backend, "poison": backend == "paged"}}}
    path = tmp_path / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(config))
    return build_runner(load_config(path))


def rollout(runner: Runner, actions, blocks: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.cat([runner.execute(ardiff.RolloutRequest(
        "s", block_index=i, actions=(actions[i % len(actions)],), seed=seed)).output.frames
        for i in range(blocks)])


@pytest.mark.parametrize("sink_frames", [0, 1])
def test_paged_and_dense_give_the_same_frames_over_three_windows(tmp_path, sink_frames):
    actions = ["right", "right", "down", "left", "up", "none"]
    paged = rollout(world_runner(tmp_path, "paged", sink_frames=sink_frames), actions)
    dense = rollout(world_runner(tmp_path, "dense", sink_frames=sink_frames), actions)
    assert paged.shape[0] >= 3 * 4
    assert (paged.int() - dense.int()).abs().max() <= 1


def test_actions_change_the_frames(tmp_path):
    left = rollout(world_runner(tmp_path), ["left"], blocks=4)
    right = rollout(world_runner(tmp_path), ["right"], blocks=4)
    assert not torch.equal(left, right)


def test_same_seed_same_frames(tmp_path):
    assert torch.equal(rollout(world_runner(tmp_path), ["up"], blocks=3),
                       rollout(world_runner(tmp_path), ["up"], blocks=3))


def test_the_spec_declares_one_register_token_set_per_frame(tmp_path):
    runner = world_runner(tmp_path, frames_per_block=2, registers_per_action=3)
    spec = runner.plan.spec
    assert spec.max_scratch_tokens_per_branch == 2 * 3
    assert spec.tokens_per_frame == (8 // 4) ** 2


def test_an_unknown_action_names_the_choices(tmp_path):
    runner = world_runner(tmp_path)
    with pytest.raises(ardiff.ConfigError, match="'jump' is not an action; use one of none"):
        runner.execute(ardiff.RolloutRequest("s", actions=("jump",)))


def test_the_shipped_config_runs_the_example():
    runner = build_runner(load_config(CONFIG))
    assert type(runner.pipeline).__name__ == "ActionWorldModel"
    frames = rollout(runner, ["left"], blocks=2)
    assert frames.shape == (2, 16 * 8, 16 * 8, 3) and frames.dtype == torch.uint8


def test_warmup_fills_sink_and_window_then_evicts(tmp_path):
    runner = world_runner(tmp_path, frames_per_block=2, sink_frames=1, window_frames=8)
    requests = runner.pipeline.ar_diffusion_warmup_requests("warm")
    assert len(requests) == 5 + 1   # ceil((1 + 8) / 2) blocks fill sink and window, one evicts
    assert all(r.session_id == "warm" for r in requests) and requests[0].reset

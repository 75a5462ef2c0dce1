"""History committed noised (`pipeline.args.context_noise`, for weights trained with their
history's noise level as an input): weights made before the input load and roll out as they
did; weights with it save and load it; a noised rollout is seeded (paged = dense, batched =
alone) and differs from a clean one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.pipelines.bouncing import BouncingWorld
from ardiff.pipelines.bouncing.checkpoint import load_weights, save_weights
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.training import drift
from ardiff.pipelines.bouncing.training.evaluate import next_frame_error, runtime_rollouts

pytestmark = pytest.mark.usefixtures("one_thread")
ACTIONS = np.array([[1, 1, 4, 4, 0, 2, 2, 3, 3, 0, 1, 4]] * 2)   # 12 frames: evicts


@pytest.fixture(scope="module")
def level_weights(tmp_path_factory) -> str:
    """The shipped weights with a context-level input that is not zero."""
    model = drift.with_context_level(load_weights(BouncingConfig()))
    torch.manual_seed(0)
    torch.nn.init.normal_(model.context_level[2].weight, std=0.05)
    path = tmp_path_factory.mktemp("w") / "level.safetensors"
    save_weights(model, path)
    return str(path)


def test_weights_without_the_input_ignore_a_level():
    model = load_weights(BouncingConfig())
    assert model.context_level is None
    t = torch.rand(1, 2)
    same = model.conditioning(t, torch.full((1, 2), 0.3)).final.shift
    assert torch.equal(same, model.conditioning(t).final.shift)


def test_weights_with_the_input_save_and_load_it(level_weights):
    model = load_weights(BouncingConfig(weights=level_weights))
    assert model.context_level is not None
    assert model.context_level[2].weight.abs().sum() > 0


def test_a_noised_history_is_seeded_and_changes_the_rollout(level_weights):
    seeds = [3, 5]
    noised = runtime_rollouts(level_weights, seeds, ACTIONS, rows=2, context_noise=0.1,
                              upscale=1)
    alone = runtime_rollouts(level_weights, seeds, ACTIONS, rows=1, context_noise=0.1,
                             upscale=1)
    np.testing.assert_allclose(noised, alone, atol=2 / 255)
    clean = runtime_rollouts(level_weights, seeds, ACTIONS, rows=2, upscale=1)
    assert np.array_equal(noised[:, :4], clean[:, :4])      # the simulator's start frames
    assert not np.array_equal(noised[:, 4:], clean[:, 4:])


def test_paged_equals_dense_with_a_noised_history(level_weights):
    pipe = BouncingWorld(weights=level_weights, context_noise=0.1, upscale=1)
    pipe.load("cpu", torch.float32)

    def video(backend: str) -> list[torch.Tensor]:
        plan = make_plan(get_spec(pipe), "float32", 4, 1 << 26, max_sessions=4)
        runner = Runner(pipe, create_cache(plan, backend, "cpu", poison=backend == "paged"))
        return [runner.execute(ardiff.RolloutRequest("s", block_index=i, seed=5,
                                                     actions=("left",))).output.frames
                for i in range(12)]
    assert all(torch.equal(a, b) for a, b in zip(video("paged"), video("dense")))


def test_the_level_must_be_below_pure_noise():
    with pytest.raises(ardiff.ConfigError, match=r"pipeline.args.context_noise: 1.0 must be "
                                                 r"in \[0, 1\)"):
        BouncingWorld(context_noise=1.0)


def test_the_next_frame_error_sees_the_history_as_the_pipeline_commits_it(level_weights):
    model = load_weights(BouncingConfig(weights=level_weights))
    clean = next_frame_error(model, 4)
    noised = next_frame_error(model, 4, context_noise=0.1)
    assert clean["copy_last_frame_mse"] == noised["copy_last_frame_mse"]
    assert clean["next_frame_mse_sampled"] != noised["next_frame_mse_sampled"]
    assert 0 < noised["next_frame_mse_sampled"] < noised["copy_last_frame_mse"]

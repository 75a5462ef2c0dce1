"""The trained bouncing-balls world model (ardiff/pipelines/bouncing/) with its shipped weights.

Rollouts go through the real runtime (Runner over the paged cache, NaN-poisoned) and are
compared with the simulator that made the training data: a few held-out worlds, a few
frames each, so the whole file runs in seconds on a CPU.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch

import ardiff
from ardiff.config.run import load_config
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.kv.state import open_state
from ardiff.pipelines.bouncing import BouncingWorld, sim
from ardiff.pipelines.bouncing.checkpoint import load_weights
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.training import locator
from ardiff.rollout.job import run_rollout

REPO = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = REPO / "configs" / "default.yaml"
HELD_OUT_SEEDS = range(900_000, 900_006)   # worlds never drawn in training
CONTEXT = BouncingConfig().context_frames
UPSCALE = BouncingConfig().upscale


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pipeline() -> BouncingWorld:
    pipe = BouncingWorld()
    pipe.load("cpu", torch.float32)
    return pipe


def make_runner(pipe, backend: str = "paged") -> Runner:
    plan = make_plan(get_spec(pipe), "float32", 4, 1 << 26, max_sessions=4)
    return Runner(pipe, create_cache(plan, backend, "cpu", poison=backend == "paged"))


def roll(runner: Runner, seed: int, actions: list[str], session: str = "s") -> np.ndarray:
    """One session, one block per action -> frames at model resolution [F, 3, 32, 32] in [0, 1]."""
    last = len(actions) - 1
    frames = [runner.execute(ardiff.RolloutRequest(session, block_index=i, seed=seed, actions=(a,),
                                                   close_session=i == last)).output.frames
              for i, a in enumerate(actions)]
    video = torch.cat(frames)[:, ::UPSCALE, ::UPSCALE]            # [F, 32, 32, 3] uint8
    return video.permute(0, 3, 1, 2).float().numpy() / 255


def simulate(seed: int, actions: list[str]) -> np.ndarray:
    ids = np.array([[sim.ACTIONS.index(a) for a in actions]])
    return sim.simulate(sim.SimState.from_seed(seed), ids)[0][0]


def test_shipped_weights_load_without_download(pipeline):
    params = sum(p.numel() for p in pipeline.model.parameters())
    assert 1_000_000 < params < 2_000_000
    assert all(torch.isfinite(p).all() for p in pipeline.model.parameters())
    spec = pipeline.ar_diffusion_kv_cache_spec()
    assert (spec.tokens_per_frame, spec.frames_per_block, spec.window_frames) == (16, 1, 5)


def test_warmup_starts_with_the_context_then_fills_the_window_and_evicts():
    pipe = BouncingWorld(window_frames=6, sink_frames=1, context_frames=3)
    requests = pipe.ar_diffusion_warmup_requests("warm")
    assert len(requests) == 3 + (1 + 6) + 1
    assert all(r.session_id == "warm" for r in requests) and requests[0].reset
    assert {r.actions[0] for r in requests} == set(sim.ACTIONS)


def test_spec_follows_the_config_and_architecture_must_match_the_weights():
    spec = BouncingWorld(window_frames=7, sink_frames=1).ar_diffusion_kv_cache_spec()
    assert (spec.window_frames, spec.sink_frames, spec.max_scratch_tokens_per_branch) == (7, 1, 2)
    with pytest.raises(ardiff.ConfigError, match=r"pipeline\.args\.dim: 64 does not match"):
        load_weights(BouncingConfig(dim=64))
    with pytest.raises(ardiff.PipelineLoadError, match="cannot read"):
        load_weights(BouncingConfig(weights="/nonexistent.safetensors"))


def test_start_frames_are_the_simulator_and_later_frames_are_generated(pipeline):
    actions = ["right"] * (CONTEXT + 2)
    video = roll(make_runner(pipeline), 3, actions)
    true = simulate(3, actions)
    assert np.abs(video[:CONTEXT] - true[:CONTEXT]).max() <= 1 / 255 + 1e-6
    assert np.abs(video[CONTEXT:] - true[CONTEXT:]).max() > 1 / 255


def test_a_sink_frame_is_shown_with_the_sprite_and_committed_with_the_balls_alone(monkeypatch):
    pipe = BouncingWorld(sink_frames=1)
    pipe.load("cpu", torch.float32)
    committed = []
    forward = pipe.model.forward_blocks

    def spy(x, conditioning, inputs, blk):
        if conditioning is pipe._conditioning(0.0):
            committed.append(x[:, 0].clone())
        return forward(x, conditioning, inputs, blk)

    monkeypatch.setattr(pipe.model, "forward_blocks", spy)
    actions = ["right"] * (CONTEXT + 1)
    video = roll(make_runner(pipe), 3, actions)
    white = [int((frame == 1).all(dim=0).sum()) for frame in torch.cat(committed)]
    assert white[0] == 0 and white[1:CONTEXT] == [sim.SPRITE_SIDE ** 2] * (CONTEXT - 1)
    world = sim.step(sim.SimState.from_seed(3), np.array([sim.ACTIONS.index("right")]))
    balls_alone = torch.from_numpy(sim.render(world, sprite=False)) * 2 - 1
    assert torch.equal(committed[0], balls_alone)
    assert np.abs(video[:CONTEXT] - simulate(3, actions)[:CONTEXT]).max() <= 1 / 255 + 1e-6


def test_paged_equals_dense(pipeline):
    actions = ["left", "down", "none", "up", "right"] * 3   # evicts: 15 frames, window 5
    paged = roll(make_runner(pipeline, "paged"), 5, actions)
    dense = roll(make_runner(pipeline, "dense"), 5, actions)
    assert np.array_equal(paged, dense)


@pytest.mark.parametrize("sink", [0, 1])
def test_training_pass_equals_the_kv_cache_path(sink):
    """forward_frames (block-causal mask, used to train) == forward_block through the KV
    state (commit clean frames, probe noisy ones), on a clip longer than the window,
    with and without a sink frame."""
    pipeline = BouncingWorld(sink_frames=sink)
    pipeline.load("cpu", torch.float32)
    model, frames_n = pipeline.model, 8
    gen = torch.Generator().manual_seed(0)
    clean = torch.from_numpy(simulate(1, ["down"] * frames_n)) * 2 - 1
    t = torch.rand(frames_n, generator=gen)
    noisy = (1 - t[:, None, None, None]) * clean + t[:, None, None, None] * torch.randn(
        clean.shape, generator=gen)
    actions = torch.full((1, 2 * frames_n), sim.ACTIONS.index("down"))
    positions = torch.arange(frames_n).repeat(2)
    is_noisy = torch.arange(2 * frames_n) >= frames_n
    with torch.inference_mode():
        batch = model.forward_frames(torch.cat([clean, noisy])[None],
                                     torch.cat([torch.zeros(frames_n), t])[None], actions,
                                     positions, is_noisy)[0]
        cache = make_runner(pipeline).cache
        for f in range(frames_n):
            inputs = model.frame_inputs(actions[:, :1], torch.tensor([f]))
            with contextlib.closing(open_state(cache, "x")) as state:
                with state.block("main") as blk:
                    probe = model.forward_block(noisy[f:f + 1],
                                                model.conditioning(t[f:f + 1, None]), inputs, blk)
                with state.block("main", commit=True) as blk:
                    commit = model.forward_block(clean[f:f + 1], model.conditioning(
                        torch.zeros(1, 1)), inputs, blk)
            torch.testing.assert_close(probe[0], batch[frames_n + f], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(commit[0], batch[f], atol=1e-4, rtol=1e-4)


def test_short_rollout_beats_copying_the_last_frame(pipeline):
    """Held-out worlds, 4 generated frames each: closer to the simulator than holding
    the last true frame."""
    runner = make_runner(pipeline)
    rng = np.random.default_rng(0)
    model_error, copy_error = [], []
    for seed in HELD_OUT_SEEDS:
        actions = [sim.ACTIONS[i] for i in rng.integers(len(sim.ACTIONS), size=CONTEXT + 4)]
        video, true = roll(runner, seed, actions, f"s{seed}"), simulate(seed, actions)
        model_error.append(((video[CONTEXT:] - true[CONTEXT:]) ** 2).mean())
        copy_error.append(((true[CONTEXT - 1] - true[CONTEXT:]) ** 2).mean())
    assert np.mean(model_error) < 0.5 * np.mean(copy_error)


def sprite_clear_of_balls(seed: int, actions: list[str], margin_px: float = 5.0) -> bool:
    """In the simulator, the sprite never comes within margin_px of a ball nor stops at a wall."""
    world = sim.SimState.from_seed(seed)
    for name in actions:
        move = sim.ACTION_MOVES[sim.ACTIONS.index(name)] * sim.SPRITE_STEP
        unclamped = world.sprite[0] + move
        world = sim.step(world, np.array([sim.ACTIONS.index(name)]))
        centre = world.sprite[0] + sim.SPRITE_SIDE / 2
        gaps = np.linalg.norm(world.pos[0] - centre, axis=-1) - world.radius[0]
        if (gaps[world.alive[0]] < margin_px).any() or (world.sprite[0] != unclamped).any():
            return False
    return True


@pytest.mark.parametrize("action, seed", [("left", 0), ("right", 0), ("up", 0), ("down", 1)])
def test_sprite_moves_in_the_commanded_direction(pipeline, action, seed):
    steps = 5   # in these worlds the sprite's path stays clear of the balls and the walls
    actions = ["none"] * CONTEXT + [action] * steps
    assert sprite_clear_of_balls(seed, actions)
    video = roll(make_runner(pipeline), seed, actions)
    centres = locator.locate_sprite(video[None]).centre[0, :, 0]      # [F, 2] (x, y)
    moved = centres[-1] - centres[CONTEXT - 1]
    expected = sim.ACTION_MOVES[sim.ACTIONS.index(action)] * sim.SPRITE_STEP * steps
    assert np.abs(moved - expected).max() <= 3, (action, moved, expected)


def test_default_config_rolls_out_end_to_end(tmp_path):
    """configs/default.yaml as `ardiff rollout` runs it: simulator start frames moved by the
    scripted actions, then generated frames, 256x256, in the file."""
    out = tmp_path / "default.npy"
    config = load_config(DEFAULT_CONFIG, [f"output.path={out}", "rollout.frames=8"])
    assert run_rollout(config).status == "ok"
    video = np.load(out)
    assert video.shape == (8, 32 * UPSCALE, 32 * UPSCALE, 3)
    script = config.rollout.actions              # one action (a name) per frame, repeating
    actions = [script[i % len(script)] for i in range(CONTEXT)]
    start = np.rint(simulate(config.rollout.seed, actions) * 255).astype(np.uint8)
    assert np.array_equal(video[:CONTEXT, ::UPSCALE, ::UPSCALE], start.transpose(0, 2, 3, 1))

"""The causal-Wan pipeline: blocks, the noise hook, guidance, and an offline CLI rollout."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest
import torch
from extras import require_extra

require_extra("wan")

from ardiff.errors import ConfigError, KVStateError  # noqa: E402
from ardiff.pipelines.causal_wan import CausalWan  # noqa: E402

TINY_CONFIG = Path(__file__).parents[3] / "configs" / "causal-wan-tiny.yaml"
PROMPT = "a red ball"


def test_blocks_give_9_then_12_frames_and_float32_latents(tiny_pipeline, run_blocks):
    outputs = run_blocks(tiny_pipeline, 2, prompt=PROMPT)
    assert [tuple(o.frames.shape) for o in outputs] == [(9, 48, 64, 3), (12, 48, 64, 3)]
    assert all(o.frames.dtype == torch.uint8 for o in outputs)
    latents = outputs[1].extra["latents"]
    assert latents.shape == (1, 16, 3, 6, 8) and latents.dtype == torch.float32
    assert tiny_pipeline.video_frames_per_latent_frame == 4


def test_same_seed_same_video_other_seed_other_video(tiny_pipeline, run_blocks):
    first = torch.cat([o.frames for o in run_blocks(tiny_pipeline, 2, prompt=PROMPT, seed=1)])
    again = torch.cat([o.frames for o in run_blocks(tiny_pipeline, 2, prompt=PROMPT, seed=1)])
    other = torch.cat([o.frames for o in run_blocks(tiny_pipeline, 2, prompt=PROMPT, seed=2)])
    assert torch.equal(first, again) and not torch.equal(first, other)


class RecordingNoise(CausalWan):
    """A subclass that overrides the hook: records every call, returns constant noise."""

    def __init__(self, **args) -> None:
        super().__init__(**args)
        self.calls: list[tuple] = []

    def noise(self, seed, block_index, step, shape, device, dtype):
        self.calls.append((seed, block_index, step, tuple(shape), dtype))
        return torch.full(shape, 0.5, device=device, dtype=dtype)


def test_the_noise_hook_is_called_per_block_and_step_and_can_be_overridden(
        tiny_args, tiny_pipeline, run_blocks):
    pipeline = RecordingNoise(**tiny_args)
    pipeline.load("cpu", torch.float32)
    outputs = run_blocks(pipeline, 2, prompt=PROMPT, seed=7)
    shape = (1, 16, 3, 6, 8)
    assert pipeline.calls == [(7, b, s, shape, torch.float32) for b in (0, 1) for s in range(4)]
    default = run_blocks(tiny_pipeline, 2, prompt=PROMPT, seed=7)
    assert not torch.equal(outputs[0].extra["latents"], default[0].extra["latents"])


def test_guidance_with_the_prompt_as_negative_equals_no_guidance(tiny_args, tiny_pipeline,
                                                                  run_blocks):
    """v_neg + g (v_pos - v_neg) with identical branches is v: exactly the unguided block."""
    pipeline = CausalWan(**tiny_args, cfg=True)
    pipeline.load("cpu", torch.float32)
    plain = run_blocks(tiny_pipeline, 2, prompt=PROMPT)
    same = run_blocks(pipeline, 2, prompt=PROMPT, negative_prompt=PROMPT, guidance_scale=3.0)
    other = run_blocks(pipeline, 2, prompt=PROMPT, negative_prompt="blur", guidance_scale=3.0)
    for a, b, c in zip(plain, same, other):
        assert torch.equal(a.extra["latents"], b.extra["latents"])
        assert not torch.equal(a.extra["latents"], c.extra["latents"])


def test_with_cfg_both_branches_commit_every_block_guided_or_not(tiny_args, tiny_pipeline):
    """An unguided block of a CFG pipeline predicts with the positive branch alone (the same
    latents as a pipeline without CFG) but commits to both, so a later guided block finds
    both histories at the same positions, and the kept latents sit at their frames."""
    from ardiff import RolloutRequest
    from ardiff.engine.runner import Runner
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan

    pipeline = CausalWan(**tiny_args, cfg=True)
    pipeline.load("cpu", torch.float32)
    plan = make_plan(pipeline.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 30)
    runner = Runner(pipeline, create_cache(plan, "paged", "cpu", poison=True), "cpu")
    with contextlib.closing(runner):
        unguided = runner.execute(RolloutRequest("s", block_index=0, prompt=PROMPT)).output
        runner.execute(RolloutRequest("s", block_index=1, prompt=PROMPT, negative_prompt="blur",
                                      guidance_scale=3.0))
        frames = {b: runner.cache.num_committed_frames("s", b) for b in ("positive", "negative")}
        kept = sorted(pipeline.kept_latents._frames["s"])
    plain = CausalWan(**tiny_args)
    plain.load("cpu", torch.float32)
    plan = make_plan(plain.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 30)
    with contextlib.closing(Runner(plain, create_cache(plan, "paged", "cpu"), "cpu")) as other:
        alone = other.execute(RolloutRequest("s", block_index=0, prompt=PROMPT)).output
    assert frames == {"positive": 6, "negative": 6}
    assert kept == [0, 1, 2, 3, 4, 5]
    assert torch.equal(unguided.extra["latents"], alone.extra["latents"])


def test_guidance_without_the_negative_branch_is_a_config_error(tiny_pipeline, run_blocks):
    with pytest.raises(ConfigError, match=r"^rollout.guidance_scale: 3.0 needs the negative "
                                          r"branch; set pipeline.args.cfg: true"):
        run_blocks(tiny_pipeline, 1, prompt=PROMPT, guidance_scale=3.0)


def test_a_step_count_other_than_the_preset_s_is_a_config_error(tiny_pipeline, run_blocks):
    with pytest.raises(ConfigError, match=r"^rollout.num_steps: 2 differs from the 4 denoising "
                                          r"steps \[1000, 750, 500, 250\] of preset "
                                          r"'self-forcing'"):
        run_blocks(tiny_pipeline, 1, prompt=PROMPT, num_steps=2)


def test_generate_block_outside_its_bind_raises(tiny_pipeline):
    from ardiff import RolloutRequest

    with pytest.raises(KVStateError, match=r"outside its bind_ar_diffusion_state"):
        tiny_pipeline.generate_block(RolloutRequest("s"), state=None)


@pytest.mark.slow  # end to end: warmup and a 48-frame rollout through the CLI
def test_the_tiny_config_rolls_out_offline(tiny_dir, ardiff_main, monkeypatch, tmp_path):
    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable (blocked by the test)")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.chdir(tiny_dir.parent)
    out = tmp_path / "x.mp4"
    result = ardiff_main("rollout", TINY_CONFIG, "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    import av

    with av.open(str(out)) as container:
        frames = sum(1 for _ in container.decode(video=0))
    assert frames == 48

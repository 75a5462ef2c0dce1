"""The tiny causal DiT reference pipeline: determinism, sensitivity, spec from config, GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ardiff
from ardiff.config.run import load_config
from ardiff.engine.build import build_runner
from ardiff.engine.loader import build_pipeline, get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.pipelines.tiny_dit import TinyCausalDiT
from ardiff.pipelines.tiny_dit.decoder import LatentDecoder
from ardiff.sizes import ceil_div

TINY_DIT_CONFIG = Path(__file__).parents[3] / "configs" / "tiny-dit.yaml"
SMALL = dict(latent_size=8, dim=32, num_heads=4, num_kv_heads=2, frames_per_block=2,
             window_frames=4, sink_frames=1, upscale=2, num_steps=2)


def rollout(blocks: int = 4, device: str = "cpu", seed: int = 0, prompts=("a red ball",),
            **args) -> torch.Tensor:
    """Frames of one session; the prompt switches (keep) every len(prompts) blocks."""
    pipeline = TinyCausalDiT(**{**SMALL, **args})
    pipeline.load(device, torch.float32)
    plan = make_plan(pipeline.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 26)
    runner = Runner(pipeline, create_cache(plan, "paged", device, poison=True), device)
    frames = [runner.execute(ardiff.RolloutRequest(
        "s", block_index=i, prompt=prompts[i * len(prompts) // blocks], seed=seed)).output.frames
        for i in range(blocks)]
    return torch.cat(frames)


def test_same_seed_same_video_and_other_seed_other_video():
    first = rollout()
    assert torch.equal(first, rollout())
    assert not torch.equal(first, rollout(seed=1))


def test_different_prompts_give_different_videos():
    assert not torch.equal(rollout(prompts=("a red ball",)), rollout(prompts=("a blue cube",)))


def test_a_prompt_switch_changes_the_frames_after_it_only():
    steady = rollout(prompts=("a red ball",))
    switched = rollout(prompts=("a red ball", "a blue cube"))
    half = steady.shape[0] // 2
    assert torch.equal(steady[:half], switched[:half])
    assert not torch.equal(steady[half:], switched[half:])


def test_the_weights_seed_changes_the_model():
    assert not torch.equal(rollout(), rollout(weights_seed=1))


def test_spec_is_derived_from_the_model_config():
    pipeline = TinyCausalDiT(**{**SMALL, "cfg": True, "text_tokens": 7})
    spec = pipeline.ar_diffusion_kv_cache_spec()
    c = pipeline.config
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size) == (
        c.num_layers, c.num_kv_heads, c.dim // c.num_heads)
    assert spec.tokens_per_frame == (c.latent_size // c.patch_size) ** 2
    assert [b.name for b in spec.kv_branches] == ["positive", "negative"]
    assert spec.cross_attention_lengths == {"text": 7}
    assert spec.model_owned_state_bytes_per_session == LatentDecoder.state_bytes(
        c.latent_channels, c.latent_size)


def test_frames_have_the_decoded_size():
    frames = rollout(blocks=1)
    side = SMALL["latent_size"] * SMALL["upscale"]
    assert frames.shape == (SMALL["frames_per_block"], side, side, 3)
    assert frames.dtype == torch.uint8


def test_guidance_needs_the_negative_branch():
    pipeline = TinyCausalDiT(**SMALL)
    with pytest.raises(ardiff.ConfigError, match="pipeline.args.cfg: true"):
        pipeline._branches(ardiff.RolloutRequest("s", guidance_scale=3.0))


def test_a_bad_model_config_names_the_arg():
    with pytest.raises(ardiff.ConfigError, match=r"pipeline\.args\.num_heads: 4 must be a "
                                                 r"multiple of num_kv_heads"):
        TinyCausalDiT(num_heads=4, num_kv_heads=3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda_like_on_cpu():
    gpu, cpu = rollout(blocks=3, device="cuda"), rollout(blocks=3)
    assert gpu.device.type == "cpu" or gpu.is_cuda
    assert (gpu.cpu().int() - cpu.int()).abs().max() <= 2  # kernels differ, pictures do not


# -- the tiny DiT through the runner: paged == dense ------------------------------------------
class LatentTap:
    """Keeps the latents the tiny DiT decodes. Its uint8 frames hardly depend on history (a
    window that drops one frame still changes no pixel by more than 1), its latents do."""

    def __init__(self, pipeline) -> None:
        self.decoder, self.latents = pipeline.decoder, []
        pipeline.decoder = self

    def __call__(self, x: torch.Tensor, state):
        self.latents.append(x.clone())  # [F, C, h, w]
        return self.decoder(x, state)

    def decode_rows(self, x: torch.Tensor, states):
        self.latents.extend(row.clone() for row in x)  # [B, F, C, h, w]
        return self.decoder.decode_rows(x, states)


def tiny_dit_rollout(backend: str, sink_frames: int, cfg: bool, num_blocks: int,
                     *extra_overrides: str):
    overrides = [f"runtime.kv.backend={backend}", f"runtime.kv.sink_frames={sink_frames}",
                 f"pipeline.args.cfg={str(cfg).lower()}", "runtime.kv.poison=true",
                 *extra_overrides]
    runner = build_runner(load_config(TINY_DIT_CONFIG, overrides))
    tap = LatentTap(runner.pipeline)
    guidance = 3.0 if cfg else 1.0
    frames = [runner.execute(ardiff.RolloutRequest(
        "s", block_index=b, prompt="a red ball", negative_prompt="blurry", seed=3,
        guidance_scale=guidance)).output.frames for b in range(num_blocks)]
    return torch.cat(frames), torch.cat(tap.latents), runner


@pytest.mark.parametrize("cfg", [False, True], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("sink_frames", [0, 2])
def test_tiny_dit_paged_and_dense_give_the_same_frames(sink_frames, cfg):
    spec = get_spec(build_pipeline(load_config(TINY_DIT_CONFIG).pipeline, TINY_DIT_CONFIG.parent))
    num_blocks = ceil_div(3 * spec.window_frames, spec.frames_per_block) + 1

    paged, paged_latents, runner = tiny_dit_rollout("paged", sink_frames, cfg, num_blocks)
    dense, dense_latents, _ = tiny_dit_rollout("dense", sink_frames, cfg, num_blocks)

    assert paged.dtype == torch.uint8 and paged.shape[0] >= 3 * spec.window_frames
    assert paged.float().std() > 1  # not a blank video
    assert (paged.int() - dense.int()).abs().max().item() <= 1
    # float32 on the CPU: both attend over the same values; a window off by one frame is ~5e-3.
    assert (paged_latents - dense_latents).abs().max().item() <= 1e-4
    plan = runner.plan
    assert plan.spec.sink_frames == sink_frames and plan.spec.num_local_kv_branches == 1 + cfg
    assert runner.cache.stats().pages_in_use == plan.history_pages_per_session  # window-bounded


def test_tiny_dit_eviction_resets_model_owned_state():
    """With room for one session, a -> b -> a restarts "a": its frames repeat exactly."""
    first, _, _ = tiny_dit_rollout("paged", 1, False, 1, "runtime.max_sessions=1")
    runner = build_runner(load_config(TINY_DIT_CONFIG, ["runtime.max_sessions=1"]))
    request = ardiff.RolloutRequest("a", prompt="a red ball", negative_prompt="blurry", seed=3)
    runner.execute(request)
    runner.execute(ardiff.RolloutRequest("b", prompt="a cat", seed=4))
    again = runner.execute(request).output.frames
    assert runner.stats().sessions["evicted"] == 2
    assert torch.equal(again, first)

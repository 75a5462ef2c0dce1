"""LongLive v1.0's own `InteractiveCausalInferencePipeline` and ardiff's causal-wan (preset
longlive) on one tiny random model, one LoRA file in LongLive's format and the same noise,
through prompt switches at latent frames 9 (cache not full) and 15 (full): every block's
latents agree within 1e-4.

LongLive's code is never copied here: the test imports it from a checkout named by
ARDIFF_LONGLIVE_SRC and skips without one (docs/causal-wan.md#prompt-switches says how).
Shims, test-only: `torch.cuda.current_device` answers 0 while LongLive imports (its
utils/memory.py asks at import), `wan.image2video` is a stub without torchvision (the
image-to-video model is not used), its attention falls back to torch's SDPA in float32 (it
casts to bfloat16 when flash-attn is missing), `text_dim` is saved in the model's config
(LongLive leaves it to the class default, Wan's 4096), its hard-coded 1.3B sizes (30 layers, 1560
tokens a frame, KV cache tensors of 12 heads x 128) are set to the tiny model's, and the
prompt embeddings and the noise are ardiff's (`torch.randn_like` replays ardiff's stream).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.heavy

SRC_ENV = "ARDIFF_LONGLIVE_SRC"
TOLERANCE = 1e-4
PROMPTS = ["a cat walks on the beach", "a dog swims in a lake", "a red ball"]
SWITCH_FRAMES = [9, 15]  # latent frames: before the cache of 12 is full, and after
NUM_FRAMES, SEED = 21, 7
TINY_WAN = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=16, in_dim=16, dim=32,
                ffn_dim=64, freq_dim=32, text_dim=32, out_dim=16, num_heads=2, num_layers=2,
                qk_norm=True, cross_attn_norm=True, eps=1e-6)  # make_tiny's, in Wan's names
LONGLIVE_PACKAGES = ("pipeline", "utils", "wan", "model", "trainer")


def longlive_source() -> Path:
    src = os.environ.get(SRC_ENV)
    if not src:
        pytest.skip(f"set {SRC_ENV} to a checkout of NVlabs/LongLive at v1.0")
    path = Path(src)
    if not (path / "pipeline" / "interactive_causal_inference.py").is_file():
        pytest.skip(f"{SRC_ENV}={src} holds no pipeline/interactive_causal_inference.py")
    return path


@pytest.fixture
def longlive(monkeypatch):
    """LongLive's modules, imported from the checkout (and forgotten afterwards)."""
    src = longlive_source()
    for name in ("peft", "omegaconf", "einops"):
        pytest.importorskip(name)
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    before = set(sys.modules)
    if importlib.util.find_spec("torchvision") is None:  # only image-to-video needs it
        image2video = types.ModuleType("wan.image2video")
        image2video.WanI2V = None  # type: ignore[attr-defined]
        sys.modules["wan.image2video"] = image2video
    try:
        modules = {name: importlib.import_module(name) for name in (
            "pipeline.interactive_causal_inference", "wan.modules.causal_model",
            "wan.modules.model", "wan.modules.attention", "utils.lora_utils")}
    except ImportError as exc:
        pytest.skip(f"LongLive's code needs {exc.name}")
    monkeypatch.undo()  # current_device back; the path is needed no longer
    attention = modules["wan.modules.attention"].attention
    float32 = functools.partial(attention, dtype=torch.float32)
    monkeypatch.setattr(modules["wan.modules.causal_model"], "attention", float32)
    monkeypatch.setattr(modules["wan.modules.model"], "flash_attention",
                        lambda q, k, v, k_lens=None, **_: float32(q, k, v))
    yield modules
    for name in set(sys.modules) - before:
        if name.split(".")[0] in LONGLIVE_PACKAGES:
            del sys.modules[name]


class ArdiffText(torch.nn.Module):
    """LongLive's text-encoder interface over ardiff's encoder (same embeddings for both)."""

    def __init__(self, encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, text_prompts: list[str]) -> dict:
        return {"prompt_embeds": torch.cat([self.encoder.encode(p) for p in text_prompts])}


class LatentsOnly(torch.nn.Module):
    """LongLive's VAE interface; the comparison is of latents, so nothing is decoded."""

    def decode_to_pixel(self, latent: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        return latent


def ardiff_noise(pipeline, block: int, step: int) -> torch.Tensor:
    """ardiff's noise for (block, step) in LongLive's layout [1, F, C, h, w]."""
    shape = pipeline.config.latent_shape
    return pipeline.noise(SEED, block, step, shape, torch.device("cpu"),
                          torch.float32).permute(0, 2, 1, 3, 4)


def prompt_of_block(block: int) -> tuple[str, bool]:
    frame = block * 3
    switched = sum(frame >= s for s in SWITCH_FRAMES)
    return PROMPTS[switched], frame in SWITCH_FRAMES


def run_longlive(modules, src: Path, pipeline, tiny_dir: Path, work: Path) -> torch.Tensor:
    """LongLive's interactive inference, as interactive_inference.py sets it up."""
    import peft
    from omegaconf import OmegaConf

    config = OmegaConf.load(src / "configs" / "longlive_interactive_inference.yaml")
    rank = torch.load(tiny_dir / "lora.pt")["generator_lora"]
    rank = next(v for k, v in rank.items() if k.endswith("lora_A.weight")).shape[0]
    config.adapter.rank = config.adapter.alpha = rank  # released: rank = alpha = 256
    folder = work / "wan_models" / config.model_name
    model_class = modules["wan.modules.causal_model"].CausalWanModel
    # LongLive leaves text_dim out of config.json (Wan's 4096 is the default); the tiny is 32
    model_class.ignore_for_config = [k for k in model_class.ignore_for_config if k != "text_dim"]
    model_class(**TINY_WAN).save_pretrained(folder)
    with contextlib.chdir(work):  # LongLive reads wan_models/<model_name>/ from here
        ll = modules["pipeline.interactive_causal_inference"].InteractiveCausalInferencePipeline(
            config, device=torch.device("cpu"), text_encoder=ArdiffText(pipeline.prompt_encoder),
            vae=LatentsOnly())
    ll.num_transformer_blocks = TINY_WAN["num_layers"]
    ll.frame_seq_length = pipeline.ar_diffusion_kv_cache_spec().tokens_per_frame
    initialize = ll._initialize_kv_cache

    def tiny_kv_cache(*args, **kwargs):  # LongLive sizes K/V tensors for 12 heads of 128
        initialize(*args, **kwargs)
        heads = TINY_WAN["num_heads"]
        for layer in ll.kv_cache1:
            for name in ("k", "v"):
                b, tokens = layer[name].shape[:2]
                layer[name] = layer[name].new_zeros(b, tokens, heads, TINY_WAN["dim"] // heads)

    ll._initialize_kv_cache = tiny_kv_cache
    checkpoint = torch.load(tiny_dir / "self_forcing.pt")["generator"]
    ll.generator.load_state_dict({k.replace("_fsdp_wrapped_module.", ""): v
                                  for k, v in checkpoint.items()})
    ll.generator.model = modules["utils.lora_utils"].configure_lora_for_model(
        ll.generator.model, model_name="generator", lora_config=config.adapter,
        is_main_process=False)
    peft.set_peft_model_state_dict(ll.generator.model,
                                   torch.load(tiny_dir / "lora.pt")["generator_lora"])
    blocks = NUM_FRAMES // 3
    noise = torch.cat([ardiff_noise(pipeline, b, 0) for b in range(blocks)], dim=1)
    renoise = [ardiff_noise(pipeline, b, s)[0] for b in range(blocks)
               for s in range(1, len(config.denoising_step_list))]
    original = torch.randn_like

    def replay(like, *args, **kwargs):
        out = renoise.pop(0)
        assert out.shape == like.shape, (out.shape, like.shape)
        return out

    torch.randn_like = replay
    try:
        with torch.no_grad():
            _, latents = ll.inference(noise, text_prompts_list=[[p] for p in PROMPTS],
                                      switch_frame_indices=SWITCH_FRAMES, return_latents=True)
    finally:
        torch.randn_like = original
    assert not renoise
    return latents.permute(0, 2, 1, 3, 4)  # [1, C, F, h, w]


def run_ardiff(pipeline) -> list[torch.Tensor]:
    from ardiff import RolloutRequest
    from ardiff.engine.runner import Runner
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan

    plan = make_plan(pipeline.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 30)
    runner = Runner(pipeline, create_cache(plan, "paged", "cpu", poison=True), "cpu")
    outputs = []
    with contextlib.closing(runner):
        for block in range(NUM_FRAMES // 3):
            prompt, switch = prompt_of_block(block)
            request = RolloutRequest("s", block_index=block, prompt=prompt, seed=SEED,
                                     clear_cross_kv=switch,
                                     extra={"recache": True} if switch else {})
            outputs.append(runner.execute(request).output.extra["latents"])
    return outputs


def test_longlive_v1_interactive_inference_equals_causal_wan(longlive, tiny_dir, tmp_path,
                                                             capsys):
    from ardiff.pipelines.causal_wan import CausalWan

    pipeline = CausalWan(model_dir=str(tiny_dir), generator_ckpt=str(tiny_dir / "self_forcing.pt"),
                         lora_ckpt=str(tiny_dir / "lora.pt"), preset="longlive", height=48,
                         width=64, text_len=TINY_WAN["text_len"], vae_dtype="float32")
    pipeline.load("cpu", torch.float32)
    theirs = run_longlive(longlive, longlive_source(), pipeline, tiny_dir, tmp_path)
    ours = run_ardiff(pipeline)
    errors = []
    for block, latents in enumerate(ours):
        expected = theirs[:, :, 3 * block:3 * block + 3]
        errors.append(float((latents - expected).abs().max() / expected.abs().max()))
    with capsys.disabled():
        print(f"\nLongLive v1.0 vs causal-wan, max relative error per block: "
              f"{['%.1e' % e for e in errors]}")
    assert max(errors) <= TOLERANCE, errors

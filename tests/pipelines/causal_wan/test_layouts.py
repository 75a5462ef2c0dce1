"""`model_dir` in the Diffusers layout or Wan's own (layouts.py): detected from file names,
planned alike, loaded to the same weights and dtypes, and the same frames out."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from extras import require_extra
from numerics import assert_floats_close, assert_frames_close

from ardiff.errors import PipelineLoadError
from ardiff.pipelines.causal_wan import CausalWan
from ardiff.pipelines.causal_wan.layouts import WAN, diffusers_transformer_config
from ardiff.pipelines.causal_wan.make_tiny import (
    SHAPES,
    TINY_VAE,
    WAN_13B_TRANSFORMER,
    write_configs,
)

# Wan-AI/Wan2.1-T2V-1.3B's config.json (WanModel's; the rest are WanModel's defaults)
WAN_13B_CONFIG = {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "dim": 1536,
                  "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_dim": 16,
                  "model_type": "t2v", "num_heads": 12, "num_layers": 30, "out_dim": 16,
                  "text_len": 512}
TINY = dict(height=48, width=64)
NEITHER = (r"^pipeline.args.model_dir: '(?P<dir>[^']+)' is in neither Wan2.1 folder layout: "
           r"the Diffusers one \(Wan-AI/Wan2.1-T2V-1.3B-Diffusers\) lacks {diffusers}; Wan's "
           r"original one \(Wan-AI/Wan2.1-T2V-1.3B\) lacks {wan}; download one: hf download "
           r"Wan-AI/Wan2.1-T2V-1.3B-Diffusers --local-dir (?P=dir) \(or hf download "
           r"Wan-AI/Wan2.1-T2V-1.3B --local-dir (?P=dir)\)$")
ALL_WAN = (r"config.json, diffusion_pytorch_model.safetensors, Wan2.1_VAE.pth, "
           r"models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/")


@pytest.fixture(scope="module")
def tiny_wan_dir(tmp_path_factory):
    """The tiny model of conftest's `tiny_dir` (same seed), in Wan's layout."""
    require_extra("wan")
    from ardiff.pipelines.causal_wan.make_tiny import write_model

    out = tmp_path_factory.mktemp("models") / "wan-layout"
    write_model(out, layout=WAN)
    return out


def test_each_layout_is_detected_and_named(tmp_path, tiny_wan_dir):
    write_configs(tmp_path, *SHAPES["tiny"])
    assert CausalWan(model_dir=str(tmp_path), **TINY).model_layout == "diffusers"
    assert CausalWan(model_dir=str(tiny_wan_dir), **TINY).model_layout == "wan"


def test_a_folder_in_neither_layout_names_both_and_how_to_download(tmp_path):
    all_diffusers = "transformer/config.json, vae/config.json, text_encoder/, tokenizer/"
    with pytest.raises(PipelineLoadError, match=NEITHER.format(diffusers=all_diffusers,
                                                               wan=ALL_WAN)):
        CausalWan(model_dir=str(tmp_path))
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps(TINY_VAE))
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    partial = NEITHER.format(diffusers="transformer/config.json, text_encoder/",
                             wan=ALL_WAN.replace("Wan2.1_VAE.pth, ", ""))
    with pytest.raises(PipelineLoadError, match=partial):
        CausalWan(model_dir=str(tmp_path))


def test_wans_1_3b_config_is_the_diffusers_repos_transformer_config(tmp_path):
    assert diffusers_transformer_config(WAN_13B_CONFIG, tmp_path) == WAN_13B_TRANSFORMER


@pytest.mark.parametrize("change, message", [
    (dict(model_type="i2v"), r"sets model_type='i2v'; causal-wan runs text-to-video \(t2v\)"),
    (dict(window_size=[4, 4]), r"sets window_size=\[4, 4\]; causal-wan needs global attention"),
    (dict(_class_name="WanTransformer3DModel"), r"is a diffusers transformer config; give the "
                                                r"folder above transformer/"),
    (dict(dim=None), r"has no key 'dim'; is it Wan's WanModel config.json\?"),
])
def test_a_wan_config_causal_wan_cannot_run_is_one_line(tmp_path, change, message):
    config = {k: v for k, v in {**WAN_13B_CONFIG, **change}.items() if v is not None}
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.model_dir: '.*config.json' "
                                                + message):
        diffusers_transformer_config(config, tmp_path / "config.json")


def test_wans_layout_plans_like_the_diffusers_one_without_diffusers(tmp_path, tiny_wan_dir,
                                                                    monkeypatch):
    """Construction reads config.json and the VAE's tensor shapes only: no diffusers."""
    write_configs(tmp_path, *SHAPES["tiny"])
    monkeypatch.setitem(sys.modules, "diffusers", None)      # importing either would fail
    monkeypatch.setitem(sys.modules, "transformers", None)
    wan = CausalWan(model_dir=str(tiny_wan_dir), **TINY)
    diffusers = CausalWan(model_dir=str(tmp_path), **TINY)
    assert wan.ar_diffusion_kv_cache_spec() == diffusers.ar_diffusion_kv_cache_spec()
    assert (wan.config.transformer, wan.config.vae) == (diffusers.config.transformer,
                                                        diffusers.config.vae)


def test_a_missing_wan_file_is_named_with_its_download(tmp_path, tiny_wan_dir):
    folder = tmp_path / "wan"
    shutil.copytree(tiny_wan_dir, folder)
    (folder / "models_t5_umt5-xxl-enc-bf16.pth").unlink()
    pipeline = CausalWan(model_dir=str(folder), **TINY, vae_dtype="float32")
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.model_dir: '.*wan/models_t5_"
                                                r"umt5-xxl-enc-bf16.pth' does not exist; Wan's "
                                                r"original layout \(Wan-AI/Wan2.1-T2V-1.3B\) has "
                                                r"config.json, .*; download it: hf download "
                                                r"Wan-AI/Wan2.1-T2V-1.3B --local-dir .*wan$"):
        pipeline.load("cpu", torch.float32)
    (folder / "Wan2.1_VAE.pth").unlink()
    with pytest.raises(PipelineLoadError, match=r"Wan2.1_VAE.pth' does not exist; Wan's"):
        CausalWan(model_dir=str(folder), **TINY)


# float16 has both exceptions (diffusers' fp32 modules, transformers' fp16 `wo`); bfloat16
@pytest.mark.parametrize("dtype", [torch.float16,
                                   pytest.param(torch.bfloat16, marks=pytest.mark.heavy)])
def test_wans_files_load_as_from_pretrained_loads_the_diffusers_folder(tiny_dir, tiny_wan_dir,
                                                                       dtype):
    """Same tensors, same dtypes (diffusers keeps its fp32 modules, transformers its fp16
    exceptions), same buffers: the two layouts are one model."""
    from ardiff.pipelines.causal_wan.models import load_transformer, load_vae
    from ardiff.pipelines.causal_wan.text import PromptEncoder

    cpu, wan, diffusers = torch.device("cpu"), dict(), dict()
    for out, folder in ((wan, tiny_wan_dir), (diffusers, tiny_dir)):
        c = CausalWan(model_dir=str(folder), **TINY, vae_dtype=str(dtype).split(".")[1]).config
        out["transformer"] = load_transformer(c, cpu, dtype)
        out["vae"] = load_vae(c, cpu)
        out["text"] = PromptEncoder.load(c.model_dir, 16, cpu, dtype).encoder
    for name in ("transformer", "vae", "text"):
        ours = {**dict(wan[name].named_parameters()), **dict(wan[name].named_buffers())}
        theirs = {**dict(diffusers[name].named_parameters()),
                  **dict(diffusers[name].named_buffers())}
        assert ours.keys() == theirs.keys(), name
        for key, value in theirs.items():
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), (name, key)
    assert wan["text"].shared.weight is wan["text"].encoder.embed_tokens.weight


def test_the_same_tiny_model_in_both_layouts_gives_the_same_frames(tiny_pipeline, tiny_args,
                                                                   tiny_wan_dir, run_blocks):
    """configs/causal-wan-tiny.yaml's settings, its Self-Forcing checkpoint, two blocks. The
    weights hold the same values laid out differently in memory, so kernels may differ: within
    the bounds across kernels."""
    wan = CausalWan(**dict(tiny_args, model_dir=str(tiny_wan_dir),
                           generator_ckpt=str(tiny_wan_dir / "self_forcing.pt")))
    wan.load("cpu", torch.float32)
    ours = run_blocks(wan, 2, prompt="a red ball")
    theirs = run_blocks(tiny_pipeline, 2, prompt="a red ball")
    for a, b in zip(ours, theirs):
        assert_frames_close(a.frames, b.frames, "frames, Wan vs Diffusers layout")
        assert_floats_close(a.extra["latents"], b.extra["latents"], "latents")
    assert ours[1].frames.shape[0] == 12 and ours[0].frames.float().std() > 0


# -- make_tiny writes Wan's real names (checked against Wan's own modules) -----------------

def test_the_wan_layout_holds_wans_own_names_and_shapes(tiny_wan_dir, monkeypatch):
    from safetensors.torch import load_file
    from wan_source import wan_module

    config = json.loads((tiny_wan_dir / "config.json").read_text())
    model = wan_module("model", monkeypatch).WanModel(
        **{k: v for k, v in config.items() if not k.startswith("_")})
    written = load_file(str(tiny_wan_dir / "diffusion_pytorch_model.safetensors"))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {
        k: tuple(v.shape) for k, v in written.items()}
    vae = wan_module("vae", monkeypatch).WanVAE_(dim=2, z_dim=16, dim_mult=[1, 2, 4, 4],
                                                 num_res_blocks=2, attn_scales=[],
                                                 temperal_downsample=[False, True, True])
    written = torch.load(tiny_wan_dir / "Wan2.1_VAE.pth", weights_only=True)
    assert {k: tuple(v.shape) for k, v in vae.state_dict().items()} == {
        k: tuple(v.shape) for k, v in written.items()}

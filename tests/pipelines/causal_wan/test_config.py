"""The spec comes from the two config.json files and the resolution, with no diffusers."""

from __future__ import annotations

import json
import sys

import pytest

from ardiff.errors import ConfigError, PipelineLoadError
from ardiff.pipelines.causal_wan import CausalWan
from ardiff.pipelines.causal_wan.make_tiny import SHAPES, write_configs

WAN_480P_CACHE_BYTES = 1_888_573_440
WAN_480P_LATENT_FRAME_BYTES = 16 * 60 * 104 * 4  # one float32 clean latent kept for a recache


@pytest.fixture
def wan_configs(tmp_path):
    """A folder holding only Wan2.1-T2V-1.3B's transformer/ and vae/ config.json."""
    write_configs(tmp_path, *SHAPES["wan2.1-1.3b"])
    return tmp_path


def test_the_wan_1_3b_spec_at_480p(wan_configs, monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)      # importing either would fail
    monkeypatch.setitem(sys.modules, "transformers", None)
    spec = CausalWan(model_dir=str(wan_configs)).ar_diffusion_kv_cache_spec()
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size) == (30, 12, 128)
    assert (spec.tokens_per_frame, spec.frames_per_block) == (1560, 3)
    assert (spec.window_frames, spec.sink_frames, spec.max_model_len) == (21, 0, 1024)
    assert spec.cross_attention_lengths == {"text": 512}
    assert [b.name for b in spec.kv_branches] == ["main"]
    assert spec.model_owned_state_bytes_per_session == (WAN_480P_CACHE_BYTES
                                                        + 21 * WAN_480P_LATENT_FRAME_BYTES)


def test_presets_cfg_and_the_vae_dtype_shape_the_spec(wan_configs):
    spec = CausalWan(model_dir=str(wan_configs), preset="longlive", cfg=True,
                     vae_dtype="float32").ar_diffusion_kv_cache_spec()
    assert (spec.window_frames, spec.sink_frames) == (9, 3)
    assert [(b.name, b.local_index) for b in spec.kv_branches] == [("positive", 0),
                                                                   ("negative", 1)]
    assert spec.model_owned_state_bytes_per_session == (2 * WAN_480P_CACHE_BYTES
                                                        + 12 * WAN_480P_LATENT_FRAME_BYTES)
    assert CausalWan(model_dir=str(wan_configs)).video_frames_per_latent_frame == 4


def test_inspect_spec_reads_only_the_config_files(wan_configs, ardiff_main, write_config):
    config = write_config("""
        pipeline:
          entry: causal-wan
          args: {model_dir: MODEL_DIR}
        runtime: {dtype: bfloat16, memory_budget: 40GiB}
    """.replace("MODEL_DIR", json.dumps(str(wan_configs))))
    result = ardiff_main("inspect-spec", config, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spec"]["tokens_per_frame"] == 1560
    assert report["memory"]["session_capacity"] >= 1


@pytest.mark.parametrize("remove, message", [
    ("transformer/config.json", r"' is in neither Wan2.1 folder layout: the Diffusers one "
                                r"\(Wan-AI/Wan2.1-T2V-1.3B-Diffusers\) lacks transformer/config"),
    ("vae/config.json", r"vae/config.json' does not exist"),
])
def test_a_missing_config_file_is_named(wan_configs, remove, message):
    (wan_configs / remove).unlink()
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.model_dir: '.*" + message):
        CausalWan(model_dir=str(wan_configs))


def test_a_missing_key_is_named(wan_configs):
    path = wan_configs / "transformer" / "config.json"
    config = json.loads(path.read_text())
    del config["num_layers"]
    path.write_text(json.dumps(config))
    with pytest.raises(PipelineLoadError, match=r"config.json' has no key 'num_layers'"):
        CausalWan(model_dir=str(wan_configs))


@pytest.mark.parametrize("args, message", [
    (dict(height=500), r"^pipeline.args.height: 500 must be a positive multiple of 16"),
    (dict(vae_dtype="fp8"), r"^pipeline.args.vae_dtype: 'fp8' is not allowed"),
    (dict(denoising_steps=[1000, 0]), r"^pipeline.args.denoising_steps: \[1000, 0\] must be"),
    (dict(preset="nope"), r"^pipeline.args.preset: 'nope' is not a causal-Wan preset"),
])
def test_bad_arguments_are_one_line_errors(wan_configs, args, message):
    with pytest.raises(ConfigError, match=message):
        CausalWan(model_dir=str(wan_configs), **args)


def test_an_image_to_video_transformer_is_refused(wan_configs):
    path = wan_configs / "transformer" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "image_dim": 1280}))
    with pytest.raises(PipelineLoadError, match=r"sets image_dim=1280 \(an image-to-video "
                                                r"model\)"):
        CausalWan(model_dir=str(wan_configs))

"""The two folder layouts of Wan2.1-T2V a `model_dir` may have, told apart by file names.

    diffusers (Wan-AI/Wan2.1-T2V-1.3B-Diffusers)   wan (Wan-AI/Wan2.1-T2V-1.3B, Wan's own)
      transformer/config.json + weights              config.json          (WanModel's keys)
      vae/config.json + weights                      diffusion_pytorch_model.safetensors
      text_encoder/   (UMT5EncoderModel)             Wan2.1_VAE.pth       (a state dict)
      tokenizer/                                     models_t5_umt5-xxl-enc-bf16.pth
                                                     google/umt5-xxl/     (the tokenizer)

`transformer/config.json` marks the first, a root `config.json` the second; a folder with
neither is one error naming both layouts, what each lacks and how to download either.
Construction reads only small files: the config.json files, and for Wan's layout the
VAE's widths from the tensor shapes in `Wan2.1_VAE.pth` (memory-mapped, no weights read).
Both give the models' configs in diffusers' terms, so the rest of the pipeline sees one.
"""

from __future__ import annotations

import json
import shlex
import zipfile
from pathlib import Path
from typing import Any

import torch

from ardiff.errors import PipelineLoadError

DIFFUSERS, WAN = "diffusers", "wan"
DIFFUSERS_REPO, WAN_REPO = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "Wan-AI/Wan2.1-T2V-1.3B"
TRANSFORMER_CONFIG, VAE_CONFIG = "transformer/config.json", "vae/config.json"
TEXT_ENCODER_DIR, TOKENIZER_DIR = "text_encoder", "tokenizer"
WAN_CONFIG = "config.json"
WAN_TRANSFORMER_FILE = "diffusion_pytorch_model.safetensors"
WAN_TRANSFORMER_INDEX = "diffusion_pytorch_model.safetensors.index.json"  # sharded (14B)
WAN_VAE_FILE = "Wan2.1_VAE.pth"
WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER = "google/umt5-xxl"
ENTRIES = {DIFFUSERS: (TRANSFORMER_CONFIG, VAE_CONFIG, TEXT_ENCODER_DIR + "/", TOKENIZER_DIR + "/"),
           WAN: (WAN_CONFIG, WAN_TRANSFORMER_FILE, WAN_VAE_FILE, WAN_T5_FILE, WAN_TOKENIZER + "/")}
# WanModel.__init__'s defaults (Wan-Video/Wan2.1 wan/modules/model.py) for keys its
# config.json leaves out; Wan2.1-T2V-1.3B's sets dim, ffn_dim, freq_dim, in/out_dim,
# num_heads, num_layers, eps, model_type and text_len.
WAN_MODEL_DEFAULTS = dict(model_type="t2v", patch_size=[1, 2, 2], in_dim=16, out_dim=16,
                          text_dim=4096, freq_dim=256, window_size=[-1, -1], qk_norm=True,
                          cross_attn_norm=True, eps=1e-6)
WAN_ROPE_FRAMES = 1024  # WanModel's rope_params(1024, ...): rows of its rotary tables
# Wan2.1's VAE (wan/modules/vae.py `_video_vae`): all but the widths, read from the file
WAN_VAE_FIXED = dict(dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                     temperal_downsample=[False, True, True], dropout=0.0)
WAN_VAE_WIDTHS = dict(base_dim=96, z_dim=16)  # if the file is not in torch's zip format
WAN_VAE_BASE_KEY, WAN_VAE_Z_KEY = "encoder.conv1.weight", "conv2.weight"


def download_commands(root: Path) -> str:
    """The two ways to fill `root`, as commands to paste."""
    target = shlex.quote(str(root))
    return (f"hf download {DIFFUSERS_REPO} --local-dir {target} (or hf download {WAN_REPO} "
            f"--local-dir {target})")


def detect_layout(root: Path) -> str:
    """`DIFFUSERS` or `WAN`, from which marker file `root` holds; else a one-line error."""
    if (root / TRANSFORMER_CONFIG).is_file():
        return DIFFUSERS
    if (root / WAN_CONFIG).is_file():
        return WAN
    lacks = {name: ", ".join(e for e in entries if not (root / e).exists())
             for name, entries in ENTRIES.items()}
    raise PipelineLoadError(
        f"pipeline.args.model_dir: {str(root)!r} is in neither Wan2.1 folder layout: the "
        f"Diffusers one ({DIFFUSERS_REPO}) lacks {lacks[DIFFUSERS]}; Wan's original one "
        f"({WAN_REPO}) lacks {lacks[WAN]}; download one: {download_commands(root)}")


def missing(root: Path, layout: str, relative: str) -> PipelineLoadError:
    """The error for an entry of `layout` that `root` lacks."""
    name, repo = ("the Diffusers layout", DIFFUSERS_REPO) if layout == DIFFUSERS else (
        "Wan's original layout", WAN_REPO)
    return PipelineLoadError(
        f"pipeline.args.model_dir: {str(root / relative)!r} does not exist; {name} ({repo}) "
        f"has {', '.join(ENTRIES[layout])}; download it: hf download {repo} --local-dir "
        f"{shlex.quote(str(root))}")


def read_json(model_dir: Path, relative: str, layout: str = DIFFUSERS) -> dict[str, Any]:
    """One config file of the model folder; a missing or broken file is one-line error."""
    path = model_dir / relative
    if not path.is_file():
        raise missing(model_dir, layout, relative)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipelineLoadError(f"pipeline.args.model_dir: cannot read {str(path)!r} "
                                f"({type(exc).__name__}: {exc})") from None
    if not isinstance(config, dict):
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} holds a "
                                f"{type(config).__name__}, not a mapping of settings")
    return config


def transformer_config(root: Path, layout: str) -> tuple[dict[str, Any], Path]:
    """`WanTransformer3DModel`'s config (diffusers' keys) and the file it was read from."""
    if layout == DIFFUSERS:
        return read_json(root, TRANSFORMER_CONFIG), root / TRANSFORMER_CONFIG
    path = root / WAN_CONFIG
    return diffusers_transformer_config(read_json(root, WAN_CONFIG, WAN), path), path


def diffusers_transformer_config(wan: dict[str, Any], path: Path) -> dict[str, Any]:
    """Wan's `WanModel` config.json in diffusers' `WanTransformer3DModel` terms."""
    if wan.get("_class_name") == "WanTransformer3DModel":
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} is a diffusers "
                                f"transformer config; give the folder above transformer/")
    missing_keys = [k for k in ("dim", "num_heads", "ffn_dim", "num_layers") if k not in wan]
    if missing_keys:
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} has no key "
                                f"{missing_keys[0]!r}; is it Wan's WanModel config.json?")
    c = {**WAN_MODEL_DEFAULTS, **wan}
    if c["model_type"] != "t2v":
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} sets model_type="
                                f"{c['model_type']!r}; causal-wan runs text-to-video (t2v) "
                                f"transformers only")
    if list(c["window_size"]) != [-1, -1]:
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} sets window_size="
                                f"{c['window_size']!r}; causal-wan needs global attention "
                                f"[-1, -1] (its window is pipeline.args.window_frames)")
    return dict(patch_size=list(c["patch_size"]), num_attention_heads=c["num_heads"],
                attention_head_dim=c["dim"] // c["num_heads"], in_channels=c["in_dim"],
                out_channels=c["out_dim"], text_dim=c["text_dim"], freq_dim=c["freq_dim"],
                ffn_dim=c["ffn_dim"], num_layers=c["num_layers"],
                cross_attn_norm=c["cross_attn_norm"],
                qk_norm="rms_norm_across_heads" if c["qk_norm"] else None, eps=c["eps"],
                image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=WAN_ROPE_FRAMES)


def vae_config(root: Path, layout: str) -> tuple[dict[str, Any], Path]:
    """`AutoencoderKLWan`'s config (diffusers' keys) and the file it was read from."""
    if layout == DIFFUSERS:
        return read_json(root, VAE_CONFIG), root / VAE_CONFIG
    path = root / WAN_VAE_FILE
    if not path.is_file():
        raise missing(root, WAN, WAN_VAE_FILE)
    return {**WAN_VAE_FIXED, **wan_vae_widths(path)}, path


def wan_vae_widths(path: Path) -> dict[str, int]:
    """`base_dim` and `z_dim` of a Wan2.1 VAE state dict, from two tensors' shapes (the
    file memory-mapped: no weights are read). Wan2.1's own if the file is not a zip."""
    if not zipfile.is_zipfile(path):
        return dict(WAN_VAE_WIDTHS)
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        return dict(base_dim=int(state[WAN_VAE_BASE_KEY].shape[0]),
                    z_dim=int(state[WAN_VAE_Z_KEY].shape[0]))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise PipelineLoadError(f"pipeline.args.model_dir: cannot read the VAE's shapes from "
                                f"{str(path)!r} ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}); is it Wan's "
                                f"Wan2.1_VAE.pth?") from None


def wan_transformer_files(root: Path) -> list[Path]:
    """The safetensors file(s) of Wan's transformer: one file, or the shards of its index."""
    if (root / WAN_TRANSFORMER_FILE).is_file():
        return [root / WAN_TRANSFORMER_FILE]
    if (root / WAN_TRANSFORMER_INDEX).is_file():
        index = read_json(root, WAN_TRANSFORMER_INDEX, WAN).get("weight_map", {})
        return [root / name for name in sorted(set(index.values()))]
    raise missing(root, WAN, WAN_TRANSFORMER_FILE)


def existing(root: Path, layout: str, relative: str) -> Path:
    """`root / relative` if it exists, else the layout's one-line error."""
    path = root / relative
    if not path.exists():
        raise missing(root, layout, relative)
    return path

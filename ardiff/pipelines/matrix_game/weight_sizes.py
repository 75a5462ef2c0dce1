"""Bytes of the Matrix-Game weights, counted from the configs: no weights read.

    weight_bytes(config, "bfloat16")   # {"transformer": ..., "image_encoder": ..., "vae": ...}

The transformer is causal-Wan's count of `WanTransformer3DModel` (less the text embedder
Matrix-Game has none of) plus the image projection and the action modules, counted by
building them on the meta device; CLIP's vision tower is sized from its file's shapes
(memory-mapped) or, without the file, as ViT-H/14; the VAE is causal-Wan's count.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ardiff.dtypes import DTYPE_BYTES
from ardiff.pipelines.causal_wan.from_state import read_state
from ardiff.pipelines.causal_wan.layouts import WAN, vae_config
from ardiff.pipelines.causal_wan.weight_sizes import transformer_params, vae_params
from ardiff.pipelines.matrix_game.action_module import ActionModule
from ardiff.pipelines.matrix_game.clip import VisionTower
from ardiff.pipelines.matrix_game.config import CLIP_FILE, MatrixGameConfig
from ardiff.pipelines.matrix_game.transformer import ImageProjection

FP32_BYTES = DTYPE_BYTES["float32"]
VIT_H = dict(dim=1280, patch=14, num_patches=256, layers=32)  # Wan2.1's open-clip ViT-H/14


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def transformer_counts(config: dict[str, Any], clip_dim: int) -> tuple[int, int]:
    """(parameters in the run dtype, kept in float32) of the whole transformer."""
    from ardiff.pipelines.matrix_game.models import diffusers_config

    backbone = diffusers_config(config)
    cast, kept = transformer_params(backbone)
    dim = config["dim"]
    cast -= (1 * dim + dim) + (dim * dim + dim)  # the text embedder (text_dim 1) is not built
    with torch.device("meta"):
        extra = _numel(ImageProjection(dim, clip_dim)) + sum(
            _numel(ActionModule(config["action_config"], dim))
            for _ in config["action_config"].get("blocks", []))
    return cast + extra, kept


def clip_tower(c: MatrixGameConfig) -> VisionTower:
    """The vision tower (on the meta device) the CLIP file describes, or ViT-H/14."""
    path = c.model_dir / CLIP_FILE
    with torch.device("meta"):
        if not path.is_file():
            return VisionTower(**VIT_H)
        state = {k: v for k, v in read_state(path).items() if k.startswith("visual.")}
        dim, _, patch, _ = state["visual.patch_embedding.weight"].shape
        layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("visual.transformer."))
        return VisionTower(dim, patch, state["visual.pos_embedding"].shape[1] - 1, layers)


def weight_bytes(c: MatrixGameConfig, dtype: str) -> dict[str, int]:
    """Bytes of each model `load` reads, once loaded with the run's `dtype`."""
    config = json.loads(c.model_config.read_text())
    tower = clip_tower(c)
    cast, kept = transformer_counts(config, tower.pos_embedding.shape[-1])
    return {"transformer": cast * DTYPE_BYTES[dtype] + kept * FP32_BYTES,
            "image_encoder": _numel(tower) * DTYPE_BYTES[dtype],
            "vae": vae_params(vae_config(c.model_dir, WAN)[0]) * DTYPE_BYTES[c.vae_dtype]}

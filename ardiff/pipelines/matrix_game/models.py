"""Loading Matrix-Game 2.0 from the released files (no hub access, no pickled code).

    <checkpoint>.safetensors   the released generator's state dict (`model.` + Wan's names):
        blocks.N.action_model.*   -> ActionModule N (released names)
        img_emb.proj.*            -> ImageProjection
        the rest                  -> diffusers' WanTransformer3DModel, renamed by
                                     convert_wan_transformer_to_diffusers (causal-Wan's)
    Wan2.1_VAE.pth             -> AutoencoderKLWan (causal-Wan's loader)
    models_clip_...-14.pth     -> VisionTower (its visual.* tensors)

Every released key must be used and every module key given: a mismatch is one line naming
the keys. The diffusers model has no text embedder here (Matrix-Game has no text).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ardiff.pipelines.causal_wan.checkpoint import strip_wrappers, to_diffusers_names
from ardiff.pipelines.causal_wan.from_state import (
    build_model,
    check_state,
    keeps_fp32_by_name,
    read_state,
)
from ardiff.pipelines.causal_wan.layouts import WAN_ROPE_FRAMES
from ardiff.pipelines.matrix_game.action_module import ActionModule
from ardiff.pipelines.matrix_game.clip import VisionTower
from ardiff.pipelines.matrix_game.config import CLIP_FILE, MatrixGameConfig
from ardiff.pipelines.matrix_game.transformer import (
    CLIP_DIM,
    ImageProjection,
    MatrixGameTransformer,
)

ACTION_INFIX = ".action_model."
IMAGE_PREFIX = "img_emb."


def diffusers_config(config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's CausalWanModel config in `WanTransformer3DModel` terms."""
    return dict(patch_size=[1, 2, 2], num_attention_heads=config["num_heads"],
                attention_head_dim=config["dim"] // config["num_heads"],
                in_channels=config["in_dim"], out_channels=config["out_dim"], text_dim=1,
                freq_dim=config["freq_dim"], ffn_dim=config["ffn_dim"],
                num_layers=config["num_layers"], cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=config["eps"], image_dim=None,
                added_kv_proj_dim=None, rope_max_seq_len=WAN_ROPE_FRAMES)


def split_state(state: dict[str, torch.Tensor]) -> tuple[dict, dict, dict[int, dict]]:
    """(backbone in Wan's names, img_emb's, per layer the action module's) of a state dict."""
    backbone, image, actions = {}, {}, {}
    for key, value in state.items():
        if key.startswith(IMAGE_PREFIX):
            image[key[len(IMAGE_PREFIX):]] = value
        elif ACTION_INFIX in key:
            head, rest = key.split(ACTION_INFIX, 1)
            actions.setdefault(int(head.split(".")[1]), {})[rest] = value
        else:
            backbone[key] = value
    return backbone, image, actions


def _strict(module: nn.Module, state: dict[str, torch.Tensor], c: MatrixGameConfig,
            dtype: torch.dtype) -> nn.Module:
    check_state(module.state_dict(), state, c.checkpoint)
    module.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return module


def load_transformer(c: MatrixGameConfig, config: dict[str, Any], device: torch.device,
                     dtype: torch.dtype) -> MatrixGameTransformer:
    """The released checkpoint as a `MatrixGameTransformer` in `dtype` on `device`."""
    from diffusers import WanTransformer3DModel

    backbone, image, action_states = split_state(strip_wrappers(read_state(c.checkpoint)))
    layers = sorted(set(action_states) | set(config["action_config"].get("blocks", [])))

    def make() -> nn.Module:
        model = WanTransformer3DModel.from_config(diffusers_config(config))
        model.condition_embedder.text_embedder = nn.Identity()  # no text in Matrix-Game
        return model

    model = build_model(make, to_diffusers_names(backbone), dtype,
                        keeps_fp32_by_name(WanTransformer3DModel._keep_in_fp32_modules),
                        c.checkpoint)
    clip_dim = image["proj.0.weight"].shape[0] if "proj.0.weight" in image else CLIP_DIM
    img_emb = _strict(ImageProjection(config["dim"], clip_dim), image, c, dtype)
    actions = {layer: _strict(ActionModule(config["action_config"], config["dim"]),
                              action_states.get(layer, {}), c, dtype)
               for layer in layers}
    for module in (model, img_emb, *actions.values()):
        module.to(device).eval().requires_grad_(False)
    return MatrixGameTransformer(model, img_emb, actions)


def load_clip(c: MatrixGameConfig, device: torch.device, dtype: torch.dtype) -> VisionTower:
    path = c.model_dir / CLIP_FILE
    tower = VisionTower.from_state(read_state(path), path)
    return tower.to(device, dtype).eval().requires_grad_(False)

"""Write a Matrix-Game 2.0 folder with random weights, in the released layout and key names.

    python -m ardiff.pipelines.matrix_game.make_tiny --out DIR             # tiny, ~3 MB
    python -m ardiff.pipelines.matrix_game.make_tiny --out DIR --shape matrix-game-2 --configs-only

    DIR/base_distilled_model/base_distill.safetensors         universal (+ config.json)
    DIR/gta_distilled_model/gta_keyboard2dim.safetensors      gta_drive (+ config.json)
    DIR/templerun_distilled_model/templerun_7dim_onlykey.safetensors   templerun (+ config.json)
    DIR/Wan2.1_VAE.pth                                        Wan's VAE names
    DIR/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth   the vision tower (visual.*)

Each config.json is the released `configs/distilled_model/<mode>/config.json` at the tiny
sizes (or the real ones with `--shape matrix-game-2`); the released `CausalWanModel` loads
the safetensors. `--configs-only` writes the configs and a VAE file (the spec reads two of
its shapes: at the real shape the file holds only those two tensors), no transformer or CLIP
weights. A command: it reads argv, prints and writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from ardiff.pipelines.shared.tiny_cli import (
    OneLineParser,
    check_counts,
    check_out,
    require_extra,
)

COMMAND = "make_tiny (matrix-game)"
VAE_FILE = "Wan2.1_VAE.pth"
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
CHECKPOINTS = {"universal": "base_distilled_model/base_distill.safetensors",
               "gta_drive": "gta_distilled_model/gta_keyboard2dim.safetensors",
               "templerun": "templerun_distilled_model/templerun_7dim_onlykey.safetensors"}
WRITTEN = {VAE_FILE, CLIP_FILE} | {path.split("/")[0] for path in CHECKPOINTS.values()}
# The released configs/distilled_model/*/config.json: what differs between the modes.
MODES = {"universal": dict(local_attn_size=6, keyboard_dim_in=4, enable_mouse=True),
         "gta_drive": dict(local_attn_size=4, keyboard_dim_in=2, enable_mouse=True),
         "templerun": dict(local_attn_size=6, keyboard_dim_in=7, enable_mouse=False)}
REAL = dict(dim=1536, ffn_dim=8960, freq_dim=256, num_heads=12, num_layers=30,
            action=dict(blocks=list(range(15)), heads_num=16, hidden_size=128,
                        img_hidden_size=1536, keyboard_hidden_dim=1024, mouse_hidden_dim=1024))
# Tiny: 2 layers, the action module in layer 0 only (so a layer without one runs too); its
# heads stay 64 wide, the width the released rotary table (8 + 28 + 28) is built for.
TINY = dict(dim=32, ffn_dim=64, freq_dim=32, num_heads=2, num_layers=2,
            action=dict(blocks=[0], heads_num=2, hidden_size=16, img_hidden_size=32,
                        keyboard_hidden_dim=128, mouse_hidden_dim=128))
# What inspect-spec reads of Wan2.1_VAE.pth (causal-Wan's layouts.wan_vae_widths): a
# configs-only folder at the real shape holds these two tensors, zeros, of Wan2.1's shapes.
VAE_SHAPES = {"encoder.conv1.weight": torch.zeros(96, 3, 3, 3, 3),
              "conv2.weight": torch.zeros(16, 16, 1, 1, 1)}
CLIP_DIM = 1280  # the released MLPProj(1280, dim): ViT-H's width
TINY_CLIP = dict(dim=32, patch=14, num_patches=256, layers=2)  # 257 tokens, as ViT-H/14


def model_config(mode: str, shape: dict[str, Any]) -> dict[str, Any]:
    """The released CausalWanModel config.json of `mode` at `shape`'s sizes."""
    m = MODES[mode]
    action = dict(shape["action"], keyboard_dim_in=m["keyboard_dim_in"],
                  enable_keyboard=True, enable_mouse=m["enable_mouse"], patch_size=[1, 2, 2],
                  qk_norm=True, qkv_bias=False, rope_dim_list=[8, 28, 28], rope_theta=256,
                  vae_time_compression_ratio=4, windows_size=3)
    if m["enable_mouse"]:
        action.update(mouse_dim_in=2, mouse_qk_dim_list=[8, 28, 28])
    return {"_class_name": "CausalWanModel", "_diffusers_version": "0.35.0.dev0",
            "action_config": action, "dim": shape["dim"], "eps": 1e-6,
            "ffn_dim": shape["ffn_dim"], "freq_dim": shape["freq_dim"], "in_dim": 36,
            "inject_sample_info": False, "local_attn_size": m["local_attn_size"],
            "model_type": "i2v", "num_heads": shape["num_heads"],
            "num_layers": shape["num_layers"], "out_dim": 16, "sink_size": 0, "text_len": 512}


def transformer_state(config: dict[str, Any], clip_dim: int) -> dict[str, torch.Tensor]:
    """Random weights in the released names (Wan's backbone names, `img_emb.proj.*`,
    `blocks.N.action_model.*`)."""
    from diffusers import WanTransformer3DModel

    from ardiff.pipelines.causal_wan.make_tiny import original_name
    from ardiff.pipelines.matrix_game.action_module import ActionModule
    from ardiff.pipelines.matrix_game.models import diffusers_config
    from ardiff.pipelines.matrix_game.transformer import ImageProjection

    backbone = WanTransformer3DModel(**diffusers_config(config))
    state = {original_name(k): v for k, v in backbone.state_dict().items()
             if not k.startswith("condition_embedder.text_embedder.")}
    state.update({f"img_emb.{k}": v for k, v in ImageProjection(config["dim"], clip_dim).state_dict().items()})
    for layer in config["action_config"]["blocks"]:
        module = ActionModule(config["action_config"], config["dim"])
        state.update({f"blocks.{layer}.action_model.{k}": v for k, v in module.state_dict().items()})
    # the released files hold WanDiffusionWrapper's state dict: the model under `model.`
    return {f"model.{k}": v.contiguous() for k, v in state.items()}


def clip_state() -> dict[str, torch.Tensor]:
    from ardiff.pipelines.matrix_game.clip import VisionTower

    tower = VisionTower(**TINY_CLIP)
    for name, value in tower.named_parameters():
        if "embedding" in name:  # zeros in the class: random here, as a trained tower's
            value.data.normal_(0, 0.5)
    state = {f"visual.{k}": v for k, v in tower.state_dict().items()}
    state["visual.head"] = torch.randn(TINY_CLIP["dim"], 16)  # the projection head (unused)
    return state


def write(out: Path, shape: str, num_layers: int | None, seed: int, configs_only: bool) -> None:
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    from ardiff.pipelines.causal_wan.make_tiny import TINY_VAE, wan_vae_state

    sizes = dict(REAL if shape == "matrix-game-2" else TINY)
    if num_layers is not None:
        sizes["num_layers"] = num_layers
        sizes["action"] = dict(sizes["action"], blocks=[b for b in sizes["action"]["blocks"]
                                                        if b < num_layers])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mode, relative in CHECKPOINTS.items():
            config = model_config(mode, sizes)
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            if not configs_only:
                state = transformer_state(config, CLIP_DIM if shape == "matrix-game-2"
                                          else TINY_CLIP["dim"])
                if shape == "matrix-game-2":
                    state = {k: v.to(torch.bfloat16) for k, v in state.items()}
                save_file(state, str(path))
        if shape == "matrix-game-2" and configs_only:  # the two tensors the widths come from
            torch.save(VAE_SHAPES, out / VAE_FILE)
        else:
            torch.save(wan_vae_state(AutoencoderKLWan(**TINY_VAE).state_dict()), out / VAE_FILE)
        if not configs_only:
            torch.save(clip_state(), out / CLIP_FILE)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog=COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder to write (created)")
    parser.add_argument("--shape", choices=("tiny", "matrix-game-2"), default="tiny")
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs-only", action="store_true",
                        help="the config.json files and the tiny VAE only (for inspect-spec)")
    args = parser.parse_args(argv)
    check_counts(COMMAND, args.num_layers, args.seed)
    out = check_out(COMMAND, args.out, WRITTEN)
    require_extra(COMMAND, "wan", "diffusers", "safetensors", "accelerate")
    out.mkdir(parents=True, exist_ok=True)
    write(out, args.shape, args.num_layers, args.seed, args.configs_only)
    print(f"wrote {out}", file=sys.stdout)


if __name__ == "__main__":
    main()

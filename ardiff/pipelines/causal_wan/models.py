"""Loading the causal-Wan models from a local folder in either layout (no hub access).

    transformer/  or diffusion_pytorch_model.safetensors (Wan's names, converted by
                  diffusers' convert_wan_transformer_to_diffusers): WanTransformer3DModel
                  (+ generator_ckpt applied strictly, + LoRA merged)
    vae/          or Wan2.1_VAE.pth (convert_wan_vae_to_diffusers): AutoencoderKLWan, in
                  the pipeline's vae_dtype
    text_encoder/ + tokenizer/   or Wan's T5 .pth + google/umt5-xxl/: UMT5 (text.py)

`from_pretrained(torch_dtype=...)` keeps the modules diffusers marks fp32 (RoPE tables,
time embedder, modulation tables, norms) in float32, as the model was trained; a later
`.to(bfloat16)` would not, so the dtype is chosen here once and never changed. Wan's
files are built with the same casts (from_state.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ardiff.dtypes import torch_dtype
from ardiff.pipelines.causal_wan.checkpoint import generator_state, load_strict, to_diffusers_names
from ardiff.pipelines.causal_wan.config import CausalWanConfig
from ardiff.pipelines.causal_wan.from_state import build_model, keeps_fp32_by_name, read_state
from ardiff.pipelines.causal_wan.layouts import (
    WAN,
    WAN_VAE_FILE,
    transformer_config,
    vae_config,
    wan_transformer_files,
)
from ardiff.pipelines.causal_wan.lora import lora_state, merge_lora
from ardiff.pipelines.causal_wan.text import check_folder

TRANSFORMER_DIR = "transformer"
VAE_DIR = "vae"


def quiet_libraries() -> None:
    """No progress bars or info logs from diffusers / transformers (ardiff renders progress)."""
    import diffusers
    import transformers

    for library in (diffusers.utils.logging, transformers.utils.logging):
        library.set_verbosity_error()
        library.disable_progress_bar()


def load_transformer(c: CausalWanConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """The transformer in `dtype` on `device`, with the generator checkpoint and LoRA applied."""
    from diffusers import WanTransformer3DModel

    if c.layout == WAN:
        model = wan_transformer(c.model_dir, dtype)
    else:
        model = WanTransformer3DModel.from_pretrained(check_folder(c.model_dir, TRANSFORMER_DIR),
                                                      torch_dtype=dtype, local_files_only=True)
    if c.generator_ckpt is not None:
        load_strict(model, generator_state(c.generator_ckpt, c.use_ema), c.generator_ckpt)
    if c.lora_ckpt is not None:
        merge_lora(model, lora_state(c.lora_ckpt), c.lora_alpha, c.lora_ckpt)
    return model.to(device).eval().requires_grad_(False)


def load_vae(c: CausalWanConfig, device: torch.device) -> Any:
    """The Wan2.1 VAE in the pipeline's `vae_dtype` (the decode cache is sized in it)."""
    from diffusers import AutoencoderKLWan

    if c.layout == WAN:
        vae = wan_vae(c.model_dir, torch_dtype(c.vae_dtype))
    else:
        vae = AutoencoderKLWan.from_pretrained(check_folder(c.model_dir, VAE_DIR),
                                               torch_dtype=torch_dtype(c.vae_dtype),
                                               local_files_only=True)
    return vae.to(device).eval().requires_grad_(False)


def wan_transformer(root: Path, dtype: torch.dtype) -> Any:
    """Wan's diffusion_pytorch_model.safetensors (one file or shards) as diffusers' model."""
    from diffusers import WanTransformer3DModel

    files = wan_transformer_files(root)
    state = {k: v for path in files for k, v in read_state(path).items()}
    config, _ = transformer_config(root, WAN)
    return build_model(lambda: WanTransformer3DModel.from_config(config),
                       to_diffusers_names(state), dtype,
                       keeps_fp32_by_name(WanTransformer3DModel._keep_in_fp32_modules), files[0])


def wan_vae(root: Path, dtype: torch.dtype) -> Any:
    """Wan's Wan2.1_VAE.pth as diffusers' AutoencoderKLWan."""
    from diffusers import AutoencoderKLWan
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    config, path = vae_config(root, WAN)
    state = convert_wan_vae_to_diffusers(read_state(root / WAN_VAE_FILE))
    return build_model(lambda: AutoencoderKLWan.from_config(config), state, dtype,
                       keeps_fp32_by_name(AutoencoderKLWan._keep_in_fp32_modules), path)

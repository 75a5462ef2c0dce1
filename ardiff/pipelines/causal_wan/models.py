"""Loading the causal-Wan models from a local diffusers-layout folder (no hub access).

    transformer/  WanTransformer3DModel (+ generator_ckpt applied strictly, + LoRA merged)
    vae/          AutoencoderKLWan, in the pipeline's vae_dtype
    text_encoder/ + tokenizer/   UMT5 (text.py)

`from_pretrained(torch_dtype=...)` keeps the modules diffusers marks fp32 (RoPE tables,
time embedder, modulation tables, norms) in float32, as the model was trained; a later
`.to(bfloat16)` would not, so the dtype is chosen here once and never changed.
"""

from __future__ import annotations

from typing import Any

import torch

from ardiff.dtypes import torch_dtype
from ardiff.pipelines.causal_wan.checkpoint import generator_state, load_strict
from ardiff.pipelines.causal_wan.config import CausalWanConfig
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

    vae = AutoencoderKLWan.from_pretrained(check_folder(c.model_dir, VAE_DIR),
                                           torch_dtype=torch_dtype(c.vae_dtype),
                                           local_files_only=True)
    return vae.to(device).eval().requires_grad_(False)

"""Bytes of the causal-Wan weights, counted from the model configs: no weights read.

    weight_bytes(config, "bfloat16")   # {"transformer": ..., "text_encoder": ..., "vae": ...}

Parameter counts follow the modules diffusers (`WanTransformer3DModel`, `AutoencoderKLWan`)
and transformers (`UMT5EncoderModel`) build from these configs, and bytes follow their
loaders: the transformer in the run's dtype except the modules diffusers keeps in float32
(`KEEP_FP32`: time embedder, norms, modulation tables); the text encoder in the run's dtype
except UMT5's `wo` under float16 (transformers keeps it in float32 there only); the VAE in
`vae_dtype`. Buffers (RoPE tables, under 1 MiB) are not weights and are not counted. The
configs are the layout's (layouts.py: in Wan's, UMT5's comes from its `.pth`'s shapes).
tests/pipelines/causal_wan/test_weight_sizes.py checks each count against the loaded module.
"""

from __future__ import annotations

import math
from typing import Any

from ardiff.dtypes import DTYPE_BYTES
from ardiff.pipelines.causal_wan.config import CausalWanConfig
from ardiff.pipelines.causal_wan.from_state import read_state
from ardiff.pipelines.causal_wan.layouts import (
    DIFFUSERS,
    TEXT_ENCODER_DIR,
    WAN,
    WAN_T5_FILE,
    existing,
    read_json,
    transformer_config,
    vae_config,
)
from ardiff.pipelines.causal_wan.umt5 import umt5_config

TEXT_ENCODER_CONFIG = TEXT_ENCODER_DIR + "/config.json"
# One block's activations beside the weights, for ardiff's fit (beside the CUDA context it
# adds): the video VAE's decode at full resolution is the largest, a few tensors of 96
# channels x 4 frames x 480 x 832 (~0.3 GiB each). An estimate, not a measurement
# (docs/causal-wan.md#where-the-text-encoder-runs).
ACTIVATION_BYTES = 2 * 2**30
FP32_BYTES = DTYPE_BYTES["float32"]
# diffusers' WanTransformer3DModel._keep_in_fp32_modules, matched against a parameter's name
# components: kept in float32 whatever dtype it is loaded in.
KEEP_FP32 = ("time_embedder", "scale_shift_table", "norm1", "norm2", "norm3")


def weight_bytes(c: CausalWanConfig, dtype: str) -> dict[str, int]:
    """Bytes of each model `load` reads, once loaded with the run's `dtype`."""
    cast, kept = transformer_params(transformer_config(c.model_dir, c.layout)[0])
    text_cast, text_kept = text_encoder_params(text_encoder_config(c), dtype)
    vae = vae_params(vae_config(c.model_dir, c.layout)[0])
    return {"transformer": cast * DTYPE_BYTES[dtype] + kept * FP32_BYTES,
            "text_encoder": text_cast * DTYPE_BYTES[dtype] + text_kept * FP32_BYTES,
            "vae": vae * DTYPE_BYTES[c.vae_dtype]}


def text_encoder_config(c: CausalWanConfig) -> dict[str, Any]:
    """UMT5's config: text_encoder/config.json, or in Wan's layout the shapes of its `.pth`
    (memory-mapped: no weights read)."""
    if c.layout == DIFFUSERS:
        return read_json(c.model_dir, TEXT_ENCODER_CONFIG)
    path = existing(c.model_dir, WAN, WAN_T5_FILE)
    return umt5_config(read_state(path), path)


def _linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def transformer_params(t: dict[str, Any]) -> tuple[int, int]:
    """`WanTransformer3DModel` (text-to-video): (parameters in the run dtype, kept float32).
    Keys the config leaves out take diffusers' defaults."""
    dim = t.get("num_attention_heads", 40) * t.get("attention_head_dim", 128)
    ffn, freq, text = t.get("ffn_dim", 13824), t.get("freq_dim", 256), t.get("text_dim", 4096)
    layers, patch = t.get("num_layers", 40), math.prod(t.get("patch_size", (1, 2, 2)))
    channels_in = t.get("in_channels", 16)
    channels_out = t.get("out_channels") or channels_in
    attention = 4 * _linear(dim, dim) + 2 * dim  # q, k, v, out; norm_q and norm_k
    block = 2 * attention + _linear(dim, ffn) + _linear(ffn, dim)
    block_fp32 = (2 * dim if t.get("cross_attn_norm", True) else 0) + 6 * dim  # norm2, table
    cast = (channels_in * patch * dim + dim                     # patch_embedding
            + _linear(dim, 6 * dim)                              # time_proj
            + _linear(text, dim) + _linear(dim, dim)             # text_embedder
            + layers * block + _linear(dim, channels_out * patch))  # blocks, proj_out
    kept = (_linear(freq, dim) + _linear(dim, dim)               # time_embedder
            + layers * block_fp32 + 2 * dim)                     # the output scale_shift_table
    return cast, kept


def text_encoder_params(e: dict[str, Any], dtype: str) -> tuple[int, int]:
    """`UMT5EncoderModel`: (parameters in the run dtype, kept float32). The token embedding is
    tied to the encoder's (counted once); every layer has its own relative position bias."""
    d_model, d_ff, layers = e["d_model"], e["d_ff"], e["num_layers"]
    inner = e["num_heads"] * e["d_kv"]
    gated = str(e.get("feed_forward_proj", "relu")).startswith("gated-")
    attention = 4 * d_model * inner + e.get("relative_attention_num_buckets", 32) * e["num_heads"]
    layer = attention + (2 if gated else 1) * d_model * d_ff + 2 * d_model  # + 2 layer norms
    wo = layers * d_ff * d_model
    kept = wo if dtype == "float16" else 0
    return e["vocab_size"] * d_model + layers * layer + wo + d_model - kept, kept


def vae_params(v: dict[str, Any]) -> int:
    """`AutoencoderKLWan` (Wan2.1: no residual down/up blocks), encoder and decoder both."""
    z_dim, dim_mult = v["z_dim"], list(v["dim_mult"])
    blocks, down = v["num_res_blocks"], list(v["temperal_downsample"])
    encoder = _vae_encoder(v["base_dim"], z_dim * 2, dim_mult, blocks,
                           list(v.get("attn_scales", [])), down, v.get("in_channels", 3))
    decoder = _vae_decoder(v.get("decoder_base_dim") or v["base_dim"], z_dim, dim_mult, blocks,
                           down[::-1], v.get("out_channels", 3))
    return encoder + _conv(2 * z_dim, 2 * z_dim, 1) + _conv(z_dim, z_dim, 1) + decoder


def _conv(n_in: int, n_out: int, kernel_volume: int) -> int:
    return n_in * n_out * kernel_volume + n_out


def _residual(n_in: int, n_out: int) -> int:
    """Two RMS norms (gamma only), two 3x3x3 causal convs, a 1x1x1 shortcut if widths differ."""
    shortcut = _conv(n_in, n_out, 1) if n_in != n_out else 0
    return n_in + _conv(n_in, n_out, 27) + n_out + _conv(n_out, n_out, 27) + shortcut


def _attention(d: int) -> int:
    return d + _conv(d, 3 * d, 1) + _conv(d, d, 1)  # norm, to_qkv, proj (1x1 conv2d)


def _middle(d: int) -> int:
    return 2 * _residual(d, d) + _attention(d)


def _resample(d: int, mode: str) -> int:
    """`WanResample`: a 3x3 conv2d (halving the width when it upsamples), plus a time conv in
    the 3d modes."""
    if mode.startswith("down"):
        return _conv(d, d, 9) + (_conv(d, d, 3) if mode == "downsample3d" else 0)
    return _conv(d, d // 2, 9) + (_conv(d, 2 * d, 3) if mode == "upsample3d" else 0)


def _vae_encoder(dim: int, z_out: int, dim_mult: list[int], blocks: int, scales: list[float],
                 down: list[bool], channels: int) -> int:
    dims = [dim * m for m in [1, *dim_mult]]
    total, scale = _conv(channels, dims[0], 27), 1.0
    for i, (n_in, n_out) in enumerate(zip(dims[:-1], dims[1:])):
        for _ in range(blocks):
            total += _residual(n_in, n_out) + (_attention(n_out) if scale in scales else 0)
            n_in = n_out
        if i != len(dim_mult) - 1:
            total += _resample(n_out, "downsample3d" if down[i] else "downsample2d")
            scale /= 2.0
    return total + _middle(dims[-1]) + dims[-1] + _conv(dims[-1], z_out, 27)


def _vae_decoder(dim: int, z_dim: int, dim_mult: list[int], blocks: int, up: list[bool],
                 channels: int) -> int:
    dims = [dim * m for m in [dim_mult[-1], *dim_mult[::-1]]]
    total = _conv(z_dim, dims[0], 27) + _middle(dims[0])
    for i, (n_in, n_out) in enumerate(zip(dims[:-1], dims[1:])):
        n_in = n_in // 2 if i > 0 else n_in  # the upsample before it halved the width
        for _ in range(blocks + 1):
            total += _residual(n_in, n_out)
            n_in = n_out
        if i != len(dim_mult) - 1:
            total += _resample(n_out, "upsample3d" if up[i] else "upsample2d")
    return total + dims[-1] + _conv(dims[-1], channels, 27)

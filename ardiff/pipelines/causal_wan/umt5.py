"""Wan's own UMT5-XXL encoder file (`models_t5_umt5-xxl-enc-bf16.pth`) as transformers'
`UMT5EncoderModel`: the same network under other names, no reshapes.

    Wan (wan/modules/t5.py T5Encoder)   transformers (UMT5EncoderModel), block N: encoder.block.N.
    token_embedding                     shared (= encoder.embed_tokens)
    blocks.N.norm1                      layer.0.layer_norm
    blocks.N.attn.{q,k,v,o}             layer.0.SelfAttention.{q,k,v,o}
    blocks.N.pos_embedding.embedding    layer.0.SelfAttention.relative_attention_bias
    blocks.N.norm2                      layer.1.layer_norm
    blocks.N.ffn.gate.0 (GELU-tanh)     layer.1.DenseReluDense.wi_0 (gelu_new)
    blocks.N.ffn.{fc1,fc2}              layer.1.DenseReluDense.{wi_1,wo}
    norm                                encoder.final_layer_norm          (all `.weight`)

The config comes from the tensor shapes, except the relative-position range (128 in Wan's
`T5RelativeEmbedding`). test_t5_keymap.py proves the map against Wan's code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ardiff.errors import PipelineLoadError
from ardiff.pipelines.causal_wan.from_state import build_model, keeps_fp32_by_name, read_state

TOP_KEYS = {"token_embedding.weight": "shared.weight",
            "norm.weight": "encoder.final_layer_norm.weight"}
TIED_KEY = "encoder.embed_tokens.weight"  # the same tensor as shared.weight
BLOCK_KEYS = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
WAN_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
UMT5_BLOCK = re.compile(r"^encoder\.block\.(\d+)\.(.+)$")
WAN_MAX_DISTANCE = 128  # T5RelativeEmbedding(max_dist=128) in Wan's t5.py
WAN_EPS = 1e-6          # T5LayerNorm(eps=1e-6)


def umt5_name(key: str) -> str | None:
    """Wan's T5 encoder key -> UMT5EncoderModel's; None for a key that is not Wan's."""
    if key in TOP_KEYS:
        return TOP_KEYS[key]
    match = WAN_BLOCK.match(key)
    if match and match[2] in BLOCK_KEYS:
        return f"encoder.block.{match[1]}.{BLOCK_KEYS[match[2]]}"
    return None


def wan_name(key: str) -> str | None:
    """The inverse of `umt5_name` (None for the tied alias and unknown keys)."""
    for wan, umt5 in TOP_KEYS.items():
        if key == umt5:
            return wan
    match = UMT5_BLOCK.match(key)
    for wan, umt5 in BLOCK_KEYS.items():
        if match and match[2] == umt5:
            return f"blocks.{match[1]}.{wan}"
    return None


def umt5_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Wan's state dict in UMT5EncoderModel's names, the tied embedding under both of them."""
    unknown = sorted(k for k in state if umt5_name(k) is None)
    if unknown:
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} has {unknown[0]!r} "
                                f"({len(unknown)} keys in all) that Wan's UMT5 encoder does not; "
                                f"is it models_t5_umt5-xxl-enc-bf16.pth?")
    out = {str(umt5_name(k)): v for k, v in state.items()}
    if "shared.weight" in out:
        out[TIED_KEY] = out["shared.weight"]
    return out


def wan_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A UMT5EncoderModel state dict in Wan's names (for make_tiny)."""
    return {str(wan_name(k)): v for k, v in state.items() if k != TIED_KEY}


def umt5_config(state: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """UMT5Config's arguments for Wan's encoder, from its tensor shapes."""
    try:
        vocab_size, d_model = state["token_embedding.weight"].shape
        buckets, num_heads = state["blocks.0.pos_embedding.embedding.weight"].shape
        attention_width = state["blocks.0.attn.q.weight"].shape[0]
        d_ff = state["blocks.0.ffn.fc1.weight"].shape[0]
    except KeyError as exc:
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} has no {exc}; is it "
                                f"Wan's UMT5 encoder (models_t5_umt5-xxl-enc-bf16.pth)?") from None
    num_layers = sum(1 for k in state if WAN_BLOCK.match(k) and k.endswith(".norm1.weight"))
    return dict(vocab_size=vocab_size, d_model=d_model, d_kv=attention_width // num_heads,
                d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                relative_attention_num_buckets=buckets,
                relative_attention_max_distance=WAN_MAX_DISTANCE,
                feed_forward_proj="gated-gelu", layer_norm_epsilon=WAN_EPS, dropout_rate=0.0,
                pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def load_wan_t5(path: Path, dtype: torch.dtype) -> Any:
    """Wan's `.pth` as a `UMT5EncoderModel` in `dtype` (on the CPU), cast as
    `from_pretrained` casts (transformers keeps `_keep_in_fp32_modules` in float32 for
    float16 only, `_keep_in_fp32_modules_strict` for float16 and bfloat16)."""
    from transformers import UMT5Config, UMT5EncoderModel

    wan = read_state(path)
    config = UMT5Config(**umt5_config(wan, path))
    keep = set(UMT5EncoderModel._keep_in_fp32_modules_strict or ())
    if dtype == torch.float16:
        keep |= set(UMT5EncoderModel._keep_in_fp32_modules or ())
    model: Any = build_model(lambda: UMT5EncoderModel(config), umt5_state(wan, path), dtype,
                             keeps_fp32_by_name(keep), path)
    model.encoder.embed_tokens.weight = model.shared.weight  # one tensor, as from_pretrained
    return model

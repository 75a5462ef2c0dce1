"""Write a causal-Wan model folder with random weights: for tests, CI and benchmarks.

    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR              # tiny, ~2 MB
    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR --configs-only --shape wan2.1-1.3b
    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR --shape wan2.1-1.3b --num-layers 4

The diffusers layout `CausalWan` loads (transformer/, vae/, text_encoder/, tokenizer/ built in
code), `self_forcing.pt` (Self-Forcing's checkpoint format, FSDP-wrapped Wan key names) and
`lora.pt` (LongLive's), all seeded. `--configs-only`: only the two config.json files the spec
reads; `--shape wan2.1-1.3b`: Wan2.1-T2V-1.3B's transformer shape (bfloat16 on disk) with the
tiny VAE. A command, not library API: it reads argv, prints and writes files.
"""

from __future__ import annotations

import argparse
import json
import re
import string
from pathlib import Path
from typing import Any

import torch

from ardiff.pipelines.causal_wan.models import quiet_libraries

TINY_TRANSFORMER = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=16,
                        in_channels=16, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64,
                        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                        eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
WAN_13B_TRANSFORMER = dict(TINY_TRANSFORMER, num_attention_heads=12, attention_head_dim=128,
                           text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30)
TINY_VAE = dict(base_dim=2, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0)
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/config.json (latents_mean / std: diffusers' defaults)
WAN_VAE = dict(TINY_VAE, base_dim=96, num_res_blocks=2)
SHAPES = {"tiny": (TINY_TRANSFORMER, TINY_VAE), "wan2.1-1.3b": (WAN_13B_TRANSFORMER, WAN_VAE)}
TINY_UMT5 = dict(d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                 relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
                 dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
LORA_RANK = 4
LORA_INIT = 0.1      # std of the random LoRA factors: a visible but small change
PERTURBATION = 0.02  # how far the checkpoint's generators sit from the folder's weights
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
FSDP_BLOCK = re.compile(r"^blocks\.(\d+)\.")  # FSDP wraps each block, and the whole model

# diffusers name -> original Wan name, for the keys of a T2V transformer (the inverse of
# diffusers' convert_wan_transformer_to_diffusers on them; tests check the round trip).
TO_ORIGINAL = (
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("attn1", "self_attn"), ("attn2", "cross_attn"),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
    (".norm2.", ".norm3."),   # diffusers' cross-attention norm is Wan's norm3
    ("proj_out", "head.head"),
)


def original_name(key: str) -> str:
    """A diffusers Wan T2V transformer key in the original Wan naming."""
    if key == "scale_shift_table":
        return "head.modulation"
    for new, old in TO_ORIGINAL:
        key = key.replace(new, old)
    return key.replace("scale_shift_table", "modulation")


def self_forcing_checkpoint(state: dict[str, torch.Tensor], seed: int) -> dict[str, Any]:
    """A training checkpoint as Self-Forcing saves it, around perturbed copies of `state`."""
    generator = torch.Generator().manual_seed(seed + 1)

    def wrapped(scale: float) -> dict[str, torch.Tensor]:
        out = {}
        for key, value in state.items():
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float32)
            name = FSDP_BLOCK.sub(r"blocks.\1._fsdp_wrapped_module.", original_name(key))
            out[f"model._fsdp_wrapped_module.{name}"] = value + scale * noise.to(value.dtype)
        return out

    return {"generator_ema": wrapped(PERTURBATION), "generator": wrapped(2 * PERTURBATION),
            "critic": {"model.head.head.weight": torch.zeros(1)}}


def lora_checkpoint(state: dict[str, torch.Tensor], seed: int) -> dict[str, Any]:
    """A LongLive-format LoRA (rank `LORA_RANK`) on every Linear of every block."""
    generator = torch.Generator().manual_seed(seed + 2)
    lora = {}
    for key, value in state.items():
        if not key.startswith("blocks.") or value.dim() != 2 or "scale_shift" in key:
            continue
        module = original_name(key).removesuffix(".weight")
        out_features, in_features = value.shape
        a = torch.randn(LORA_RANK, in_features, generator=generator) * LORA_INIT
        b = torch.randn(out_features, LORA_RANK, generator=generator) * LORA_INIT
        lora[f"base_model.model.{module}.lora_A.weight"] = a
        lora[f"base_model.model.{module}.lora_B.weight"] = b
    return {"generator_lora": lora}


def tokenizer_vocab() -> list[tuple[str, float]]:
    """Special tokens, the word-start marker, then letters, digits and punctuation."""
    pieces = ["▁"] + list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces += ["▁" + c for c in string.ascii_lowercase]
    return [(t, 0.0) for t in SPECIAL_TOKENS] + [(p, -float(len(p))) for p in pieces]


def write_configs(out: Path, transformer: dict[str, Any], vae: dict[str, Any]) -> None:
    """transformer/config.json and vae/config.json only (what the KV spec is read from)."""
    for name, cls, config in (("transformer", "WanTransformer3DModel", transformer),
                              ("vae", "AutoencoderKLWan", vae)):
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps({"_class_name": cls, **config},
                                                           indent=2) + "\n")


def write_model(out: Path, shape: str = "tiny", num_layers: int | None = None,
                seed: int = 0) -> None:
    """The whole folder: four models (the VAE always tiny), and for the tiny shape
    `self_forcing.pt` and `lora.pt`."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    quiet_libraries()
    transformer_config = dict(SHAPES[shape][0])
    if num_layers is not None:
        transformer_config["num_layers"] = num_layers
    vocab = tokenizer_vocab()
    text_layers = TINY_UMT5["num_layers"] if shape == "tiny" else 1  # width 4096: one will do
    text_config = UMT5Config(vocab_size=len(vocab), d_model=transformer_config["text_dim"],
                             **dict(TINY_UMT5, num_layers=text_layers))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = WanTransformer3DModel(**transformer_config)
        vae = AutoencoderKLWan(**TINY_VAE)
        encoder = UMT5EncoderModel(text_config)
    if shape != "tiny":
        transformer = transformer.to(torch.bfloat16)  # half the disk; the weights are random
    transformer.save_pretrained(out / "transformer")
    vae.save_pretrained(out / "vae")
    encoder.save_pretrained(out / "text_encoder")
    T5Tokenizer(vocab=vocab, extra_ids=0).save_pretrained(out / "tokenizer")
    if shape == "tiny":
        state = transformer.state_dict()
        torch.save(self_forcing_checkpoint(state, seed), out / "self_forcing.pt")
        torch.save(lora_checkpoint(state, seed), out / "lora.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="transformer layers (default: the shape's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs-only", action="store_true",
                        help="write only transformer/ and vae/ config.json (for inspect-spec)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.configs_only:
        transformer, vae = SHAPES[args.shape]
        if args.num_layers is not None:
            transformer = dict(transformer, num_layers=args.num_layers)
        write_configs(args.out, transformer, vae)
    else:
        write_model(args.out, args.shape, args.num_layers, args.seed)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()

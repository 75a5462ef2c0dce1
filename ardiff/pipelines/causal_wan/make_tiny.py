"""Write a causal-Wan model folder with random weights: for tests, CI and benchmarks.

    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR              # tiny, ~2 MB
    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR --layout wan # Wan's own files
    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR --configs-only --shape wan2.1-1.3b
    python -m ardiff.pipelines.causal_wan.make_tiny --out DIR --shape wan2.1-1.3b --num-layers 4

The diffusers layout (transformer/, vae/, text_encoder/, tokenizer/ built in code), or the
same seeded weights in Wan's original layout and key names (`--layout wan`, layouts.py);
`self_forcing.pt` (Self-Forcing's checkpoint format, FSDP-wrapped Wan key names) and
`lora.pt` (LongLive's), all seeded. `--configs-only`: only the three config.json files the
spec and the weights' sizes are read from (the real UMT5-XXL's at the 1.3B shape; diffusers
layout only); `--shape wan2.1-1.3b`: Wan2.1-T2V-1.3B's transformer shape (bfloat16 on
disk) with the tiny VAE. A command, not library API: it reads argv, prints and writes files.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import string
import sys
from pathlib import Path
from typing import Any

import torch

from ardiff.extras import missing_extra_message
from ardiff.pipelines.causal_wan.layouts import (
    DIFFUSERS,
    WAN,
    WAN_CONFIG,
    WAN_T5_FILE,
    WAN_TOKENIZER,
    WAN_TRANSFORMER_FILE,
    WAN_VAE_FILE,
)
from ardiff.pipelines.causal_wan.models import quiet_libraries
from ardiff.pipelines.causal_wan.umt5 import WAN_MAX_DISTANCE, wan_state

TINY_TRANSFORMER = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=16,
                        in_channels=16, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64,
                        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                        eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024)
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
WAN_13B_TRANSFORMER = dict(TINY_TRANSFORMER, num_attention_heads=12, attention_head_dim=128,
                           text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30)
# two res blocks per stage, as Wan2.1's VAE: diffusers' converter of Wan's VAE assumes them
TINY_VAE = dict(base_dim=2, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0)
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/config.json (latents_mean / std: diffusers' defaults)
WAN_VAE = dict(TINY_VAE, base_dim=96)
SHAPES = {"tiny": (TINY_TRANSFORMER, TINY_VAE), "wan2.1-1.3b": (WAN_13B_TRANSFORMER, WAN_VAE)}
TINY_UMT5 = dict(d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                 relative_attention_max_distance=WAN_MAX_DISTANCE, feed_forward_proj="gated-gelu",
                 dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
# google/umt5-xxl's encoder (Wan-AI/Wan2.1-T2V-1.3B-Diffusers text_encoder/config.json)
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                num_heads=64, relative_attention_num_buckets=32,
                relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
                layer_norm_epsilon=1e-6, dropout_rate=0.1, tie_word_embeddings=False,
                pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
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
# diffusers' Wan2.1 VAE names -> Wan's (wan/modules/vae.py), for original_vae_name
RESNET_PARTS = (("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."),
                ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut."))
VAE_PREFIXES = tuple((f"{side}.{new}", f"{side}.{old}") for side in ("encoder", "decoder")
                     for new, old in (("conv_in.", "conv1."), ("norm_out.", "head.0."),
                                      ("conv_out.", "head.2."),
                                      ("mid_block.attentions.0.", "middle.1."))) + (
    ("quant_conv.", "conv1."), ("post_quant_conv.", "conv2."))


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
    """transformer/, vae/ and text_encoder/ config.json only (what the KV spec and the weights'
    sizes are read from); the text encoder is UMT5-XXL for a transformer of its width."""
    text_encoder = UMT5_XXL if transformer["text_dim"] == UMT5_XXL["d_model"] else dict(
        TINY_UMT5, vocab_size=len(tokenizer_vocab()), d_model=transformer["text_dim"])
    for name, head, config in (
            ("transformer", {"_class_name": "WanTransformer3DModel"}, transformer),
            ("vae", {"_class_name": "AutoencoderKLWan"}, vae),
            ("text_encoder", {"architectures": ["UMT5EncoderModel"], "model_type": "umt5"},
             text_encoder)):
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps({**head, **config}, indent=2) + "\n")


def original_vae_name(key: str) -> str:
    """A diffusers Wan2.1 VAE key in Wan's naming: the inverse of diffusers'
    convert_wan_vae_to_diffusers, which assumes three res blocks and an upsampler per
    decoder stage (Wan's decoder.upsamples.N, N = 4 stage + resnet, upsampler 4 stage + 3)."""
    for new, old in VAE_PREFIXES:
        if key.startswith(new):
            return old + key[len(new):]
    if match := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.+)", key):
        return f"{match[1]}.middle.{2 * int(match[2])}.{_resnet_part(match[3])}"
    if match := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", key):
        return f"decoder.upsamples.{4 * int(match[1]) + int(match[2])}.{_resnet_part(match[3])}"
    if match := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)", key):
        return f"decoder.upsamples.{4 * int(match[1]) + 3}.{match[2]}"
    if match := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.(.+)", key):
        rest = match[2]
        if not rest.startswith(("resample.", "time_conv.")):
            rest = _resnet_part(rest)
        return f"encoder.downsamples.{match[1]}.{rest}"
    return key


def _resnet_part(rest: str) -> str:
    for new, old in RESNET_PARTS:
        if rest.startswith(new):
            return old + rest[len(new):]
    raise ValueError(f"make_tiny: no Wan name for the res-block weight {rest!r}")


def wan_vae_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers VAE state dict in Wan's names, checked to convert back exactly."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    out = {original_vae_name(k): v for k, v in state.items()}
    if len(out) != len(state) or set(convert_wan_vae_to_diffusers(out)) != set(state):
        raise RuntimeError("make_tiny: the VAE's Wan names do not convert back (a bug)")
    return out


def wan_model_config(transformer: dict[str, Any]) -> dict[str, Any]:
    """Wan's WanModel config.json for a diffusers transformer config (layouts.py reads it)."""
    heads = transformer["num_attention_heads"]
    return {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "model_type": "t2v",
            "patch_size": transformer["patch_size"], "text_len": 512,
            "in_dim": transformer["in_channels"], "dim": heads * transformer["attention_head_dim"],
            "ffn_dim": transformer["ffn_dim"], "freq_dim": transformer["freq_dim"],
            "text_dim": transformer["text_dim"], "out_dim": transformer["out_channels"],
            "num_heads": heads, "num_layers": transformer["num_layers"], "window_size": [-1, -1],
            "qk_norm": transformer["qk_norm"] is not None,
            "cross_attn_norm": transformer["cross_attn_norm"], "eps": transformer["eps"]}


def write_wan_layout(out: Path, transformer_config: dict[str, Any], transformer: Any, vae: Any,
                     encoder: Any, tokenizer: Any) -> None:
    """The four models as Wan-AI/Wan2.1-T2V-1.3B holds them (the T5 file in the models' own
    dtype, whatever its name says)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / WAN_CONFIG).write_text(json.dumps(wan_model_config(transformer_config), indent=2)
                                  + "\n")
    save_file({original_name(k): v.contiguous() for k, v in transformer.state_dict().items()},
              str(out / WAN_TRANSFORMER_FILE))
    torch.save(wan_vae_state(vae.state_dict()), out / WAN_VAE_FILE)
    torch.save(wan_state(encoder.state_dict()), out / WAN_T5_FILE)
    tokenizer.save_pretrained(out / WAN_TOKENIZER)


def write_model(out: Path, shape: str = "tiny", num_layers: int | None = None,
                seed: int = 0, layout: str = DIFFUSERS) -> None:
    """The whole folder in `layout` (`DIFFUSERS` or `WAN`): four models (the VAE always
    tiny), and for the tiny shape `self_forcing.pt` and `lora.pt`; the same seed gives the
    same weights in either layout."""
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
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0)
    if layout == WAN:
        write_wan_layout(out, transformer_config, transformer, vae, encoder, tokenizer)
    else:
        transformer.save_pretrained(out / "transformer")
        vae.save_pretrained(out / "vae")
        encoder.save_pretrained(out / "text_encoder")
        tokenizer.save_pretrained(out / "tokenizer")
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
    parser.add_argument("--layout", choices=(DIFFUSERS, WAN), default=DIFFUSERS,
                        help="the Diffusers layout or Wan's original one (default: diffusers)")
    parser.add_argument("--configs-only", action="store_true",
                        help="write only transformer/, vae/ and text_encoder/ config.json "
                             "(for inspect-spec)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    if args.configs_only and args.layout == WAN:
        parser.error("--configs-only writes the diffusers layout: Wan's reads the VAE's widths "
                     "from Wan2.1_VAE.pth, so write the whole folder")
    try:
        _write(args)
    except ModuleNotFoundError as exc:  # the wan extra: one line naming the install
        message = missing_extra_message(exc, "make_tiny")
        if message is None:
            raise
        parser.exit(2, f"error: {message}\n")
    logging.getLogger(__name__).info("wrote %s", args.out)


def _write(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    if args.configs_only:
        transformer, vae = SHAPES[args.shape]
        if args.num_layers is not None:
            transformer = dict(transformer, num_layers=args.num_layers)
        write_configs(args.out, transformer, vae)
    else:
        write_model(args.out, args.shape, args.num_layers, args.seed, args.layout)


if __name__ == "__main__":
    main()

"""Self-Forcing / CausVid / LongLive checkpoints applied over a diffusers transformer.

A training checkpoint (`.pt`) holds `generator_ema` and / or `generator` (`critic` is
ignored) in the original Wan key names, FSDP-wrapped:

    model._fsdp_wrapped_module.blocks.0._fsdp_wrapped_module.self_attn.q.weight
      -> strip "_fsdp_wrapped_module." and a leading "model."  -> blocks.0.self_attn.q.weight
      -> diffusers' convert_wan_transformer_to_diffusers       -> blocks.0.attn1.to_q.weight

Loaded strictly: a missing or unexpected key or a differing shape is a one-line error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ardiff.errors import PipelineLoadError

FSDP_INFIX = "_fsdp_wrapped_module."
WRAPPER_PREFIX = "model."
SHOWN_KEYS = 3  # names listed in an error before "..."


def read_checkpoint(path: Path, what: str) -> dict[str, Any]:
    """The `.pt` at `path` (tensors only: `weights_only`), or a one-line error. Checked at
    `load`, not at construction: `inspect-spec` needs the config files only."""
    if not path.is_file():
        raise PipelineLoadError(f"pipeline.args.{what}: {str(path)!r} does not exist; give the "
                                f"checkpoint's path (docs/causal-wan.md#weights)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise PipelineLoadError(f"pipeline.args.{what}: cannot read {str(path)!r} "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(checkpoint, dict):
        raise PipelineLoadError(f"pipeline.args.{what}: {str(path)!r} holds a "
                                f"{type(checkpoint).__name__}, not a dict of state dicts")
    return checkpoint


def strip_wrappers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop FSDP's infix everywhere and the training wrapper's leading `model.`."""
    out = {}
    for key, value in state.items():
        key = key.replace(FSDP_INFIX, "")
        out[key.removeprefix(WRAPPER_PREFIX)] = value
    return out


def to_diffusers_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original Wan key names -> diffusers' (on a copy: the converter pops its argument)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(dict(state))


def generator_state(path: Path, use_ema: bool) -> dict[str, torch.Tensor]:
    """The generator's weights of a training checkpoint, in diffusers' names."""
    checkpoint = read_checkpoint(path, "generator_ckpt")
    key = "generator_ema" if use_ema else "generator"
    if key not in checkpoint:
        found = ", ".join(map(str, checkpoint)) or "nothing"
        raise PipelineLoadError(f"pipeline.args.generator_ckpt: {str(path)!r} has no {key!r} "
                                f"(it holds: {found}); set pipeline.args.use_ema: "
                                f"{str(not use_ema).lower()} or give another checkpoint")
    return to_diffusers_names(strip_wrappers(checkpoint[key]))


def _names(keys: list[str]) -> str:
    shown = ", ".join(sorted(keys)[:SHOWN_KEYS])
    return shown + (f" ... ({len(keys)} in all)" if len(keys) > SHOWN_KEYS else "")


def load_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Copy `state` into `model` (keeping each parameter's dtype); every key must match."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = ([f"missing {_names(missing)}"] if missing else []) + (
            [f"unexpected {_names(unexpected)}"] if unexpected else [])
        raise PipelineLoadError(f"pipeline.args.generator_ckpt: {str(path)!r} does not fit the "
                                f"transformer in model_dir: {'; '.join(parts)}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise PipelineLoadError(f"pipeline.args.generator_ckpt: {str(path)!r} has {key} of "
                                    f"shape {tuple(value.shape)}; the transformer in model_dir "
                                    f"has {tuple(expected[key].shape)}")
    model.load_state_dict(state, strict=True)

"""LongLive's LoRA, merged into the transformer's Linear weights at load time.

LongLive trains a LoRA (rank = alpha = 256, peft) on every Linear of the generator's
attention blocks and saves it under `generator_lora`:

    base_model.model.blocks.0.self_attn.q.lora_A.weight   [rank, in]
    base_model.model.blocks.0.self_attn.q.lora_B.weight   [out, rank]

Merged, `W <- W + (alpha / rank) * B @ A` (float32, stored in W's dtype): the same Linear
as peft's run-time `W x + (alpha / rank) * B (A x)`, with no cost per forward.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from ardiff.errors import PipelineLoadError
from ardiff.pipelines.causal_wan.checkpoint import (
    read_checkpoint,
    strip_wrappers,
    to_diffusers_names,
)

LORA_KEY = "generator_lora"
PEFT_PREFIX = "base_model.model."
PARTS = ("lora_A", "lora_B")


def lora_state(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Diffusers module name -> {"lora_A": A, "lora_B": B} from a LongLive LoRA `.pt`."""
    checkpoint = read_checkpoint(path, "lora_ckpt")
    state = checkpoint.get(LORA_KEY, checkpoint)
    names = {}
    for key, value in strip_wrappers(state).items():
        key = key.removeprefix(PEFT_PREFIX).removeprefix("model.").replace(".default.", ".")
        names[key] = value
    modules: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for key, value in to_diffusers_names(names).items():
        module, part, leaf = key.rsplit(".", 2)
        if part not in PARTS or leaf != "weight":
            raise PipelineLoadError(f"pipeline.args.lora_ckpt: {str(path)!r} has {key!r}; a "
                                    f"LoRA holds only <module>.lora_A.weight / .lora_B.weight")
        modules[module][part] = value
    for module, parts in modules.items():
        if set(parts) != set(PARTS):
            raise PipelineLoadError(f"pipeline.args.lora_ckpt: {str(path)!r} has only "
                                    f"{', '.join(parts)} for {module}; each module needs both "
                                    f"lora_A and lora_B")
    return dict(modules)


@torch.no_grad()
def merge_lora(model: torch.nn.Module, modules: dict[str, dict[str, torch.Tensor]],
               alpha: float | None, path: Path) -> int:
    """Add each module's `(alpha / rank) B @ A` to its weight (alpha None: alpha = rank,
    LongLive's rule). Returns the number of Linears changed."""
    for name, parts in sorted(modules.items()):
        try:
            linear = model.get_submodule(name)
        except AttributeError:
            raise PipelineLoadError(f"pipeline.args.lora_ckpt: {str(path)!r} adapts {name}, "
                                    f"which the transformer does not have") from None
        a, b = parts["lora_A"].float(), parts["lora_B"].float()
        rank = a.shape[0]
        if b.shape[1] != rank or (b.shape[0], a.shape[1]) != tuple(linear.weight.shape):
            raise PipelineLoadError(f"pipeline.args.lora_ckpt: {str(path)!r} has A "
                                    f"{tuple(a.shape)} / B {tuple(b.shape)} for {name}, whose "
                                    f"weight is {tuple(linear.weight.shape)}")
        scale = (rank if alpha is None else alpha) / rank
        delta = scale * (b.to(linear.weight.device) @ a.to(linear.weight.device))
        linear.weight.copy_((linear.weight.float() + delta).to(linear.weight.dtype))
    return len(modules)

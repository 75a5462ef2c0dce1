"""The bouncing world model's weights on disk: bf16 safetensors with the architecture inside.

A weights file records the config's ARCH_FIELDS (and any metrics) in its metadata;
loading refuses a config whose architecture differs, naming the field. The model's
optional inputs (`CONTEXT_LEVEL`) are the weights' own: recorded only when present, so
files made before them load as they were. The shipped
file lives in the `weights/` folder beside this module and is read without download.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch

import ardiff
from ardiff.pipelines.bouncing.config import ARCH_FIELDS, BouncingConfig
from ardiff.pipelines.bouncing.model import BouncingDiT

WEIGHTS_PACKAGE = "ardiff.pipelines.bouncing.weights"
WEIGHTS_FILE = "bouncing.safetensors"
STORED_DTYPE = torch.bfloat16   # halves the file; the pipeline computes in float32
TRAIN_COMMAND = "python -m ardiff.pipelines.bouncing.train"
CONTEXT_LEVEL = "context_level"  # metadata: the model takes its history's noise level


def shipped_weights() -> Path:
    """Where the weights that ship with ardiff are (the training script writes them there)."""
    return Path(str(resources.files(WEIGHTS_PACKAGE) / WEIGHTS_FILE))


def save_weights(model: BouncingDiT, path, metrics: dict | None = None) -> None:
    """Write bf16 weights with the architecture (and any metrics) in the metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu", STORED_DTYPE).contiguous()
               for k, v in model.state_dict().items()}
    arch = {**model.c.architecture(),
            **({CONTEXT_LEVEL: True} if model.context_level is not None else {})}
    save_file(tensors, str(path), metadata={"config": json.dumps(arch),
                                            "metrics": json.dumps(metrics or {})})


def load_weights(c: BouncingConfig) -> BouncingDiT:
    """The model of config `c` with its trained weights (float32, CPU). Nothing is downloaded.

    Raises `ardiff.PipelineLoadError` when the file cannot be read and `ardiff.ConfigError`
    when its architecture is not `c`'s.
    """
    from safetensors import SafetensorError, safe_open

    path = c.weights or str(shipped_weights())
    try:
        with safe_open(path, framework="pt") as f:
            arch = json.loads(f.metadata()["config"])
            tensors = {k: f.get_tensor(k).float() for k in f.keys()}
    except (OSError, KeyError, ValueError, RuntimeError, TypeError, SafetensorError) as exc:
        raise ardiff.PipelineLoadError(f"pipeline.args.weights: cannot read {path!r} "
                                       f"({type(exc).__name__}: {exc}); train weights with "
                                       f"`{TRAIN_COMMAND}`") from exc
    for name in ARCH_FIELDS:
        if arch.get(name) != getattr(c, name):
            raise ardiff.ConfigError(f"pipeline.args.{name}: {getattr(c, name)!r} does not match "
                                     f"the weights ({name}={arch.get(name)!r} in {path}); drop "
                                     f"the override or retrain with `{TRAIN_COMMAND}`")
    model = BouncingDiT(c, context_level=bool(arch.get(CONTEXT_LEVEL, False)))
    model.load_state_dict(tensors)
    return model

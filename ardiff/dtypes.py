"""The one table of runtime dtypes: their names (as configs write them) and sizes.

Importing this module does not import torch (the CLI's startup stays fast);
`torch_dtype` does, when a run needs the tensor type.
"""

from __future__ import annotations

from typing import Literal

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTypeName = Literal["float32", "bfloat16", "float16"]
RuntimeDTypeName = Literal["auto", "float32", "bfloat16", "float16"]
"""What `runtime.dtype` accepts: `auto` is resolved with the device
(`ardiff.engine.device.resolve_dtype`: bfloat16 on CUDA, float32 on CPU)."""


def torch_dtype(name: str):
    """The `torch.dtype` called `name` (one of `DTYPE_BYTES`)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]

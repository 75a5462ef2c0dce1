"""The KV backends: one table from `runtime.kv.backend` to the class that implements it.

    BACKENDS["paged"].cache_class()      -> PagedKVCache (imports torch only then)

Everything that lists backends reads this table: the config's allowed values and its
JSON Schema, the `--json` schema's enum, `create_cache`, the bench's arms and the tests
that run on every backend. Adding one is a new module with a `KVCacheBase` subclass
(constructed as `cls(plan, device, poison)`) and one entry here. Importing this module
imports nothing, so the config layer and `ardiff --help` stay free of torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only: importing the backends imports torch
    from ardiff.kv.backend import KVCacheBase


@dataclass(frozen=True)
class Backend:
    """One backend: `target` is `module:Class`; `is_reference` marks the oracle the others
    are compared to (the bench's `X/dense` ratios); `pages_registers_when_compiled`: under
    `runtime.compile` it keeps register tokens in pages (a kernel that reads only pages)."""

    target: str
    summary: str
    is_reference: bool = False
    pages_registers_when_compiled: bool = False

    def cache_class(self) -> type[KVCacheBase[Any]]:
        module, _, name = self.target.partition(":")
        cache_class: type[KVCacheBase[Any]] = getattr(importlib.import_module(module), name)
        return cache_class


BACKENDS: dict[str, Backend] = {
    "paged": Backend("ardiff.kv.paged:PagedKVCache",
                     "pages from one pool shared by every session (the runtime)",
                     pages_registers_when_compiled=True),
    "dense": Backend("ardiff.kv.dense:DenseKVCache",
                     "contiguous per-layer tensors, as the research repos keep them (the reference)",
                     is_reference=True),
}
DEFAULT_BACKEND = "paged"


def backend_names() -> tuple[str, ...]:
    """The names `runtime.kv.backend` accepts, in the table's order."""
    return tuple(BACKENDS)


def reference_backend() -> str:
    """The backend the others are measured against."""
    return next(name for name, backend in BACKENDS.items() if backend.is_reference)

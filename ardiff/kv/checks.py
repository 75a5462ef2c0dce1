"""Checks of the tensors a pipeline passes to `blk.attend`: shape, dtype, device.

    if not checks.accepts(blk, layer, q, k, v, extra_k, extra_v):   # a few comparisons
        checks.query(layer, q); checks.kv(...); checks.extra(...)    # raise, naming the fault

`accepts` passes only what the full checks pass too, so nothing goes unchecked; what it
does not accept goes through the full checks, which raise a `KVStateError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ardiff.errors import KVStateError

if TYPE_CHECKING:  # pragma: no cover - typing only: state imports this module
    from ardiff.contract.spec import ARDiffusionKVCacheSpec
    from ardiff.kv.state import Block


class TensorChecks:
    """Shape, dtype and device checks of the tensors a pipeline passes in.

    `accepts` is the per-attend fast path: a few comparisons that pass only arguments the
    full checks pass too; anything else goes through the full checks, which raise with the
    message. So checking costs next to nothing and nothing goes unchecked."""

    def __init__(self, spec: ARDiffusionKVCacheSpec, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.spec, self.dtype, self.device = spec, dtype, device
        self._kv_tail = (spec.num_kv_heads, spec.head_size)
        self._num_layers, self._max_registers = spec.num_layers, spec.max_scratch_tokens_per_branch
        self._on_cpu = device.type == "cpu"
        self._block_shapes = {n: (n * spec.tokens_per_frame, *self._kv_tail)  # k/v shape
                              for n in range(1, spec.frames_per_block + 1)}

    def accepts(self, blk: Block, layer: object, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
                traced: bool = False) -> bool:
        """Whether the full checks would pass (False: maybe not; run them), for arguments of
        any type (a pipeline may pass anything). `traced` (a compiled layer stack) leaves out
        the once-per-layer rule of a commit, which the block's end checks there."""
        state = blk._state
        if blk.is_finished or state._closed or state._session.is_released:
            return False
        if type(layer) is not int or not 0 <= layer < self._num_layers or (
                not traced and blk.is_commit and layer in blk.attended_layers):
            return False
        try:
            shape = self._block_shapes[blk.num_frames]
            q_shape = q.shape
            ok = (k.shape == shape and v.shape == shape and len(q_shape) == 3
                  and q_shape[0] > 0 and q_shape[2] == shape[2] and q_shape[1] % shape[1] == 0
                  and self._same(q) and self._same(k) and self._same(v))
            if extra_k is None or not ok:
                return ok and extra_v is None
            e_shape = extra_k.shape
            return (e_shape[1:] == self._kv_tail and extra_v is not None
                    and extra_v.shape == e_shape
                    and 1 <= e_shape[0] <= self._max_registers
                    and self._same(extra_k) and self._same(extra_v))
        except (AttributeError, TypeError, IndexError, KeyError):  # the full checks say why
            return False

    def accepts_rows(self, num_rows: int, num_frames: int, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, extra_k: torch.Tensor | None,
                     extra_v: torch.Tensor | None) -> bool:
        """`accepts`' tensor checks for a batch's `[num_rows, ...]` tensors, every row at once
        (rows share one shape, dtype and device); the block and layer rules are each row's."""
        try:
            shape = (num_rows, *self._block_shapes[num_frames])
            q_shape = q.shape
            ok = (k.shape == shape and v.shape == shape and len(q_shape) == 4
                  and q_shape[0] == num_rows and q_shape[1] > 0 and q_shape[3] == shape[3]
                  and q_shape[2] % shape[2] == 0
                  and self._same(q) and self._same(k) and self._same(v))
            if extra_k is None or not ok:
                return ok and extra_v is None
            e_shape = extra_k.shape
            return (e_shape[0] == num_rows and e_shape[2:] == self._kv_tail
                    and extra_v is not None and extra_v.shape == e_shape
                    and 1 <= e_shape[1] <= self._max_registers
                    and self._same(extra_k) and self._same(extra_v))
        except (AttributeError, TypeError, IndexError, KeyError):  # the full checks say why
            return False

    def _same(self, t: torch.Tensor) -> bool:
        """A torch.Tensor of the runtime dtype on the runtime device (on CPU, `is_cpu`:
        cheaper than building `t.device`)."""
        return (type(t) is torch.Tensor and t.dtype == self.dtype
                and (t.is_cpu if self._on_cpu else t.device == self.device))

    def tensor(self, layer: int, label: str, t: object) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise KVStateError(f"attend(layer={layer}): {label} is a {type(t).__name__}, "
                               f"expected a torch.Tensor")
        if t.dtype != self.dtype:
            raise KVStateError(f"attend(layer={layer}): {label} is {t.dtype}; expected "
                               f"{self.dtype} (the runtime dtype)")
        if t.device.type != self.device.type or (
                self.device.index is not None and t.device.index != self.device.index):
            raise KVStateError(f"attend(layer={layer}): {label} is on {t.device}; expected "
                               f"{self.device}")
        return t

    def query(self, layer: int, q: object) -> None:
        q = self.tensor(layer, "q", q)
        heads, hs = self.spec.num_kv_heads, self.spec.head_size
        if q.dim() != 3 or q.shape[0] == 0 or q.shape[2] != hs or q.shape[1] % heads:
            raise KVStateError(f"attend(layer={layer}): q has shape {tuple(q.shape)}; expected "
                               f"[q_tokens > 0, q_heads (a multiple of num_kv_heads={heads}), "
                               f"head_size={hs}]")

    def kv(self, layer: int, label: str, t: object, tokens: int, what: str) -> None:
        t = self.tensor(layer, label, t)
        expected = (tokens, self.spec.num_kv_heads, self.spec.head_size)
        if tuple(t.shape) != expected:
            raise KVStateError(f"attend(layer={layer}): {label} has shape {tuple(t.shape)}; "
                               f"expected [{what}, num_kv_heads, head_size] = {expected}")

    def extra(self, layer: int, extra_k: object, extra_v: object) -> None:
        if extra_k is None and extra_v is None:
            return
        if extra_k is None or extra_v is None:
            raise KVStateError(f"attend(layer={layer}): pass both extra_k and extra_v or neither")
        extra_k = self.tensor(layer, "extra_k", extra_k)
        limit = self.spec.max_scratch_tokens_per_branch
        n = extra_k.shape[0] if extra_k.dim() else 0
        if not 1 <= n <= limit:
            raise KVStateError(f"attend(layer={layer}): {n} register tokens passed; the spec "
                               f"allows 1..max_scratch_tokens_per_branch={limit}")
        self.kv(layer, "extra_k", extra_k, n, "n")
        self.kv(layer, "extra_v", extra_v, n, "n")

"""Cross-attention K/V (e.g. prompt tokens): allocated lazily per (session, branch, cache name)."""

from __future__ import annotations

import torch

from ardiff.contract.forward import CrossLayers
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.errors import KVStateError


class CrossKVStore:
    """Owns every cross-attention tensor; `release` frees a session's at once."""

    def __init__(self, spec: ARDiffusionKVCacheSpec, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.spec = spec
        self.dtype = dtype
        self.device = device
        self._entries: dict[tuple[str, str, str], CrossLayers] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for layers in self._entries.values() for pair in layers for t in pair)

    def num_entries(self, session_id: str | None = None) -> int:
        return sum(1 for key in self._entries if session_id in (None, key[0]))

    def get(self, session_id: str, branch: str, name: str) -> CrossLayers | None:
        self._check_name(name)
        return self._entries.get((session_id, branch, name))

    def set(self, session_id: str, branch: str, name: str, layers: CrossLayers) -> None:
        """Store all layers or nothing: the previous entry stays if anything is wrong."""
        self._check_name(name)
        layers = list(layers)
        if len(layers) != self.spec.num_layers:
            raise KVStateError(f"set_cross_kv({branch!r}, {name!r}): got {len(layers)} layers; "
                               f"expected num_layers={self.spec.num_layers} (k, v) pairs")
        expected = (self.spec.cross_attention_lengths[name], self.spec.num_kv_heads,
                    self.spec.head_size)
        for i, pair in enumerate(layers):
            self._check_pair(branch, name, i, pair, expected)
        self._entries[(session_id, branch, name)] = [
            (k.detach().clone(), v.detach().clone()) for k, v in layers]

    def clear(self, session_id: str, branch: str, names: list[str] | None = None) -> None:
        """Drop `names` (default: all); an undeclared name raises before anything is dropped."""
        names = list(self.spec.cross_attention_lengths) if names is None else list(names)
        for name in names:
            self._check_name(name)
        for name in names:
            self._entries.pop((session_id, branch, name), None)

    def release(self, session_id: str) -> None:
        for key in [key for key in self._entries if key[0] == session_id]:
            del self._entries[key]

    def _check_name(self, name: str) -> None:
        if name not in self.spec.cross_attention_lengths:
            known = ", ".join(self.spec.cross_attention_lengths) or "none"
            raise KVStateError(f"cross-attention cache {name!r} is not declared by the spec "
                               f"(declared: {known})")

    def _check_pair(self, branch: str, name: str, layer: int, pair: object,
                    expected: tuple[int, int, int]) -> None:
        where = f"set_cross_kv({branch!r}, {name!r}) layer {layer}"
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise KVStateError(f"{where}: expected a (k, v) pair, got {type(pair).__name__}")
        for label, tensor in zip(("k", "v"), pair):
            if not isinstance(tensor, torch.Tensor):
                raise KVStateError(f"{where}: {label} is a {type(tensor).__name__}, not a tensor")
            if tuple(tensor.shape) != expected:
                raise KVStateError(f"{where}: {label} has shape {tuple(tensor.shape)}; expected "
                                   f"[num_tokens, num_kv_heads, head_size] = {expected}")
            if tensor.dtype != self.dtype or tensor.device.type != self.device.type:
                raise KVStateError(f"{where}: {label} is {tensor.dtype} on {tensor.device}; "
                                   f"expected {self.dtype} on {self.device}")

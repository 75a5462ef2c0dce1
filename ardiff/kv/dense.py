"""The dense reference backend: contiguous per-layer K/V tensors per session and branch.

Written the straightforward way the research repos do it (concatenate, then
slice to the window), with its own window arithmetic over frame indices. It
is the oracle the paged backend is tested against and the baseline `bench`
compares with; it is not meant to be fast or frugal.
"""

from __future__ import annotations

import torch

from ardiff.kv.backend import CacheStats, KVCacheBase


class DenseKVCache(KVCacheBase["DenseBranch"]):
    backend_name = "dense"

    def new_branch(self, session_id: str, name: str) -> DenseBranch:
        return DenseBranch(self)

    def release_branch(self, branch: DenseBranch) -> None:
        branch.release()

    def stats(self) -> CacheStats:
        kv_bytes = sum(branch.nbytes for session in self._sessions.values()
                       for branch in session.branches.values())
        return CacheStats("dense", None, None, None, kv_bytes, self.cross.nbytes,
                          len(self._sessions))


class DenseBranch:
    """History of one branch: kept frame indices and one K and V tensor per layer."""

    def __init__(self, cache: DenseKVCache) -> None:
        self.spec, self.attend_fn = cache.spec, cache.attend_fn
        self.num_committed_frames = 0
        self.frames: list[int] = []
        self.k = [_empty(cache) for _ in range(self.spec.num_layers)]
        self.v = [_empty(cache) for _ in range(self.spec.num_layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @property
    def kept_frames(self) -> list[int]:
        return list(self.frames)

    def begin(self, num_frames: int, commit: bool = True) -> DenseBlock:
        return DenseBlock(self, num_frames)

    def begin_recache(self, start_frame: int, num_frames: int) -> DenseRecache:
        return DenseRecache(self, start_frame, num_frames)

    def rows(self, frames: list[int]) -> torch.Tensor:
        """Row indices of the K/V of kept `frames`, in order."""
        tpf = self.spec.tokens_per_frame
        return torch.tensor([self.frames.index(f) * tpf + t for f in frames for t in range(tpf)],
                            dtype=torch.long, device=self.k[0].device)

    def append(self, new_k: list[torch.Tensor], new_v: list[torch.Tensor], num_frames: int) -> None:
        self.k = [torch.cat([old, new]) for old, new in zip(self.k, new_k)]
        self.v = [torch.cat([old, new]) for old, new in zip(self.v, new_v)]
        self.frames += list(range(self.num_committed_frames, self.num_committed_frames + num_frames))
        self.num_committed_frames += num_frames
        self._apply_window()

    def _apply_window(self) -> None:
        s = self.spec
        sink = [f for f in self.frames if f < s.sink_frames]
        rest = [f for f in self.frames if f >= s.sink_frames]
        if s.reset_at_boundary:
            rest = rest if len(rest) + s.frames_per_block <= s.window_frames else []
        else:
            past = max(0, s.window_frames - s.frames_per_block)
            rest = rest[-past:] if past else []  # the last `past` (all, if fewer)
        kept = sink + rest
        if kept == self.frames:
            return
        where = torch.tensor([self.frames.index(f) for f in kept], dtype=torch.long,
                             device=self.k[0].device)
        token = torch.arange(s.tokens_per_frame, device=where.device)
        rows = (where[:, None] * s.tokens_per_frame + token).reshape(-1)
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.frames = kept

    def release(self) -> None:
        self.frames = []
        self.k = [k[:0] for k in self.k]
        self.v = [v[:0] for v in self.v]
        self.num_committed_frames = 0


def _empty(cache: DenseKVCache) -> torch.Tensor:
    """No frames yet: [0, num_kv_heads, head_size]."""
    spec = cache.spec
    return torch.empty(0, spec.num_kv_heads, spec.head_size, dtype=cache.torch_dtype,
                       device=cache.device)


class DenseBlock:
    def __init__(self, branch: DenseBranch, num_frames: int) -> None:
        self.branch, self.num_frames = branch, num_frames
        self.start_frame = branch.num_committed_frames
        self.visible_frames = list(branch.frames)
        self.new_k: dict[int, torch.Tensor] = {}
        self.new_v: dict[int, torch.Tensor] = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
               scale: float | None) -> torch.Tensor:
        keys, values = self.keys_values(layer, k, v)
        keys += [extra_k] if extra_k is not None else []
        values += [extra_v] if extra_v is not None else []
        return self.branch.attend_fn(q, torch.cat(keys), torch.cat(values), scale)

    def keys_values(self, layer: int, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """[history | k] and [history | v], to concatenate (the batched attend's rows)."""
        self.new_k[layer], self.new_v[layer] = k, v
        return [self.branch.k[layer], k], [self.branch.v[layer], v]

    def history_stamp(self, layer: int) -> tuple[object, ...] | None:
        """The layer's history tensors themselves: a commit or recache replaces them, never
        writes into them."""
        return (self.branch.k[layer], self.branch.v[layer])

    def commit(self) -> None:
        layers = range(self.branch.spec.num_layers)
        self.branch.append([self.new_k[i] for i in layers], [self.new_v[i] for i in layers],
                           self.num_frames)

    def abort(self) -> None:
        self.new_k.clear()
        self.new_v.clear()


class DenseRecache(DenseBlock):
    """Re-runs committed frames [start_frame, start_frame + num_frames): it sees the kept
    frames before them and all of them; its commit overwrites the rows of those it keeps
    (nothing appended, nothing evicted; evicted ones were context only)."""

    def __init__(self, branch: DenseBranch, start_frame: int, num_frames: int) -> None:
        super().__init__(branch, num_frames)
        self.start_frame = start_frame
        self.visible_frames = [f for f in branch.frames if f < start_frame]
        self._seen = branch.rows(self.visible_frames)
        self._rewritten = [f for f in branch.frames
                           if start_frame <= f < start_frame + num_frames]
        tpf = branch.spec.tokens_per_frame
        self._own_rows = torch.tensor([(f - start_frame) * tpf + t for f in self._rewritten
                                       for t in range(tpf)], dtype=torch.long,
                                      device=branch.k[0].device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
               scale: float | None) -> torch.Tensor:
        self.new_k[layer], self.new_v[layer] = k, v
        seen_k = self.branch.k[layer].index_select(0, self._seen)
        seen_v = self.branch.v[layer].index_select(0, self._seen)
        keys = [seen_k, k] + ([extra_k] if extra_k is not None else [])
        values = [seen_v, v] + ([extra_v] if extra_v is not None else [])
        return self.branch.attend_fn(q, torch.cat(keys), torch.cat(values), scale)

    def commit(self) -> None:
        branch, own = self.branch, self._own_rows
        rows = branch.rows(self._rewritten)
        branch.k = [k.index_copy(0, rows, self.new_k[i].index_select(0, own))
                    for i, k in enumerate(branch.k)]
        branch.v = [v.index_copy(0, rows, self.new_v[i].index_select(0, own))
                    for i, v in enumerate(branch.v)]

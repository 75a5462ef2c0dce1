"""Rows of a batched forward as the shipped pipelines run them: one layer stack for a batch
of sessions and for one session alone.

    rows = as_rows(states, len(requests))       # a batch (generate_blocks) ...
    rows = OneRow(state)                        # ... or one session (generate_block)
    with rows.block("main", commit=True) as blk:
        out = blk.attend(layer, q, k, v)        # q [B, tokens, heads, hs] -> [B, tokens, ...]
    part = subset(rows, [0, 2])                 # rows 0 and 2 alone (e.g. those that sample)
    groups = group_rows(keys)                   # {key: [row, ...]}, in first-seen order
    x = put({key: (rows, take(y, rows, B)) ...}, B)   # rows done in groups, back in row order

`OneRow` is a batch of one over a single session's state: its block hands row 0 to that
state's block unchanged (the same tensors, views of the same memory), so a pipeline whose
`generate_block` is `generate_blocks` over `OneRow` runs one session's kernels in the
order it ran them before batching.
A batch of one (`as_rows`, `subset`) is always a `OneRow`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ContextManager, Iterator, Literal, TypeVar, cast

import torch

from ardiff.errors import PipelineError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.contract.forward import (
        ARDiffusionKVBlock,
        ARDiffusionKVState,
        ARDiffusionKVStateBatch,
    )
    from ardiff.kv.state import KVState

Key = TypeVar("Key", bound=Hashable)


class OneRowBlock:
    """One session's block seen as a batch block of one row (`ARDiffusionKVBatchBlock`)."""

    def __init__(self, blk: ARDiffusionKVBlock) -> None:
        self.blk = blk

    @property
    def start_frames(self) -> list[int]:
        return [self.blk.start_frame]

    @property
    def visible_frames(self) -> list[list[int]]:
        return [self.blk.visible_frames]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None = None, extra_v: torch.Tensor | None = None,
               scale: float | None = None) -> torch.Tensor:
        """q [1, q_tokens, heads, hs] (k, v, extras likewise, row 0 only) -> [1, q_tokens, ...]."""
        extra_k = None if extra_k is None else extra_k[0]
        extra_v = None if extra_v is None else extra_v[0]
        return self.blk.attend(layer, q[0], k[0], v[0], extra_k=extra_k, extra_v=extra_v,
                               scale=scale)[None]


class OneRowScope:
    """The `with` of `OneRow.block`: the session's own block scope, its block as one row."""

    def __init__(self, scope: ContextManager[ARDiffusionKVBlock]) -> None:
        self.scope = scope

    def __enter__(self) -> OneRowBlock:
        return OneRowBlock(self.scope.__enter__())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> Literal[False]:
        self.scope.__exit__(exc_type, exc, traceback)
        return False


class OneRow:
    """One session's state as a batch of one (`ardiff.ARDiffusionKVStateBatch`)."""

    def __init__(self, state: ARDiffusionKVState) -> None:
        self.state = state

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> ARDiffusionKVState:
        if index not in (0, -1):
            raise IndexError(f"row {index} of a batch of one")
        return self.state

    def __iter__(self) -> Iterator[ARDiffusionKVState]:
        return iter((self.state,))

    def block(self, branch: str, commit: bool = False,
              num_frames: int | None = None) -> OneRowScope:
        return OneRowScope(self.state.block(branch, commit, num_frames))


def as_rows(states: ARDiffusionKVStateBatch,
            num_requests: int | None = None) -> ARDiffusionKVStateBatch:
    """`states` as the pipelines run them (a batch of one becomes a `OneRow`); raises
    `PipelineError` unless it holds one state per request (when `num_requests` is given)."""
    if num_requests is not None and len(states) != num_requests:
        raise PipelineError(f"generate_blocks: {num_requests} requests but {len(states)} KV "
                            f"states; pass one state per request, in the requests' order")
    return OneRow(states[0]) if len(states) == 1 and not isinstance(states, OneRow) else states


def subset(states: ARDiffusionKVStateBatch, rows: Sequence[int]) -> ARDiffusionKVStateBatch:
    """The batch of `states`' rows `rows` (in that order): `states` itself when that is all
    of them, a `OneRow` for one row, else an `ardiff.kv.batch.KVStateBatch` over them."""
    if list(rows) == list(range(len(states))):
        return as_rows(states, len(states))
    if len(rows) == 1:
        return OneRow(states[rows[0]])
    from ardiff.kv.batch import KVStateBatch  # the runtime's batch; loaded only when batching

    return KVStateBatch([cast("KVState", states[row]) for row in rows])


def group_rows(keys: Sequence[Key]) -> dict[Key, list[int]]:
    """Rows by key, e.g. by step count: {key: [rows with it]}, keys in first-seen order."""
    groups: dict[Key, list[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return groups


def take(x: torch.Tensor, rows: Sequence[int], num_rows: int) -> torch.Tensor:
    """x[rows] along dim 0, without a copy when `rows` is all `num_rows` of them."""
    if list(rows) == list(range(num_rows)):
        return x
    return x[list(rows)]


def put(parts: dict[Any, tuple[list[int], torch.Tensor]], num_rows: int) -> torch.Tensor:
    """Rows computed in groups back in row order: {key: (rows, x[len(rows), ...])} -> x[B, ...]."""
    if len(parts) == 1:
        ((rows, x),) = parts.values()
        if list(rows) == list(range(num_rows)):
            return x
    order = [0] * num_rows  # row -> its place in the concatenated parts
    pieces, offset = [], 0
    for rows, x in parts.values():
        for position, row in enumerate(rows):
            order[row] = offset + position
        pieces.append(x)
        offset += len(rows)
    return torch.cat(pieces)[order]

"""Several sessions' blocks as one: the KV state of a batched forward (issue #26).

    states = KVStateBatch([open_state(cache, sid) for sid in session_ids])
    with states.block("main", commit=True) as blk:      # one block per row, entered in order
        out = blk.attend(layer, q, k, v)                # q: [B, q_tokens, q_heads, hs]

Row i is `states[i]`, its own session: it attends to its own visible history + its own
block (+ its registers). Histories may differ in length (ragged is the normal case). Every
row's block is today's single `state.block(...)`: the same checks (each message names the
row and its session), the same commit or give-back on exit. Entering is all or nothing.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Iterator, Literal, Sequence, cast

import torch

from ardiff.contract.forward import ARDiffusionKVBatchBlock, ARDiffusionKVStateBatch
from ardiff.errors import KVStateError
from ardiff.kv.backend import RowKV, StackedKV, attend_rows
from ardiff.kv.state import Block, BlockScope, KVState


class KVStateBatch:
    """The states of a batch's sessions, in request order (`ardiff.ARDiffusionKVStateBatch`).

    All over one cache, distinct sessions, each open; raises `KVStateError` otherwise."""

    def __init__(self, states: Sequence[KVState]) -> None:
        self._states = list(states)
        if not self._states:
            raise KVStateError("KVStateBatch: no states; a batch holds one state per session "
                               "(at least one)")
        first = self._states[0]
        seen: dict[str, int] = {}
        for row, state in enumerate(self._states):
            if not isinstance(state, KVState):
                raise KVStateError(f"KVStateBatch: row {row} is a {type(state).__name__}, not "
                                   f"a KVState; pass open_state(cache, session_id) per row")
            if state._cache is not first._cache:
                raise KVStateError(f"KVStateBatch: row {row} (session {state.session_id!r}) is "
                                   f"over another cache than row 0 (session "
                                   f"{first.session_id!r}); a batch shares one cache")
            if state.session_id in seen:
                raise KVStateError(f"KVStateBatch: session {state.session_id!r} is in rows "
                                   f"{seen[state.session_id]} and {row}; a batch holds each "
                                   f"session once")
            seen[state.session_id] = row
            state.check_open()
        self.cache = first._cache
        # Per (branch, layer): the rows' stacked K/V, kept while their histories stay
        # (`attend_rows`' memo; one batch's probes and commit of a block read one history).
        self.stacked: dict[str, dict[int, StackedKV]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, index: int) -> KVState:
        return self._states[index]

    def __iter__(self) -> Iterator[KVState]:
        return iter(self._states)

    @property
    def session_ids(self) -> list[str]:
        return [state.session_id for state in self._states]

    def block(self, branch: str, commit: bool = False,
              num_frames: int | None = None) -> BatchBlockScope:
        """One block per row on `branch` (see `KVState.block`); a context manager."""
        return BatchBlockScope(self, branch, commit, num_frames)


class BatchBlockScope:
    """The `with` of `states.block(...)`: enters every row's block in row order (all or
    nothing), and on exit ends every row's block as its own `with` would."""

    def __init__(self, batch: KVStateBatch, branch: str, commit: bool,
                 num_frames: int | None) -> None:
        self.batch, self.branch, self.commit, self.num_frames = batch, branch, commit, num_frames
        self.scopes: list[BlockScope] = []
        self.blk: BatchBlock | None = None

    def __enter__(self) -> BatchBlock:
        cache, states = self.batch.cache, self.batch._states
        if self.scopes:
            raise KVStateError(f"batch block on branch {self.branch!r} entered twice; open a "
                               f"new one with states.block(...)")
        cache.blocks_per_slot = len(states)  # one block per row on the branch's slot
        try:
            blocks = [self._enter_row(row, state) for row, state in enumerate(states)]
        finally:
            cache.blocks_per_slot = 1
        self.blk = BatchBlock(self.batch, blocks)
        return self.blk

    def _enter_row(self, row: int, state: KVState) -> Block:
        scope = state.block(self.branch, self.commit, self.num_frames)
        try:
            blk = scope.__enter__()
        except BaseException as error:
            self._give_back(error)
            if isinstance(error, KVStateError):
                raise KVStateError(f"batch block on branch {self.branch!r}: row {row} (session "
                                   f"{state.session_id!r}): {error}") from error
            raise
        self.scopes.append(scope)
        return blk

    def _give_back(self, error: BaseException) -> None:
        """Rows entered before a failing one end as failed blocks: nothing is committed."""
        while self.scopes:
            try:
                self.scopes.pop().__exit__(type(error), error, error.__traceback__)
            except BaseException:  # the enter's error is the one to raise
                pass

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> Literal[False]:
        """Every row exits (commits or gives back), last row first as nested `with`s would
        (the pool hands each row's pages back to it next block, so its cached addresses
        hold), even past one whose exit raises; the error of the first row that raised
        (in row order) is raised, naming its row and session."""
        failures: list[tuple[int, BaseException]] = []
        for row in range(len(self.scopes) - 1, -1, -1):
            try:
                self.scopes[row].__exit__(exc_type, exc, traceback)
            except BaseException as row_error:  # the other rows still exit
                failures.append((row, row_error))
        failures.reverse()
        self.scopes = []
        if self.blk is not None:
            self.blk.is_finished = True
        if failures and exc_type is None:
            row, error = failures[0]
            if not isinstance(error, KVStateError):
                raise error
            others = f" ({len(failures) - 1} other rows failed too)" if len(failures) > 1 else ""
            raise KVStateError(f"batch block on branch {self.branch!r}: row {row} (session "
                               f"{self.batch[row].session_id!r}): {error}{others}") from error
        return False


class BatchBlock:
    """One block per row (`ardiff.ARDiffusionKVBatchBlock`); `attend` once per layer."""

    def __init__(self, batch: KVStateBatch, blocks: list[Block]) -> None:
        self.batch, self.blocks = batch, blocks
        self.branch = blocks[0].branch
        self.is_finished = False
        # Their backend blocks: what a batched attend reads and writes (begin()'s, a RowKV).
        self._rows = [cast(RowKV, blk._kv) for blk in blocks]

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def start_frames(self) -> list[int]:
        return [blk.start_frame for blk in self.blocks]

    @property
    def visible_frames(self) -> list[list[int]]:
        return [blk.visible_frames for blk in self.blocks]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None = None, extra_v: torch.Tensor | None = None,
               scale: float | None = None) -> torch.Tensor:
        """Row i of q attends to row i's [visible history | k[i]/v[i] | extra[i]].

        q: [B, q_tokens, q_heads, hs]; k, v: [B, num_frames * tokens_per_frame, kv_heads,
        hs]; extra_k/v: [B, n, kv_heads, hs]. Returns [B, q_tokens, q_heads, hs]. Raises
        `KVStateError` as each row's single attend would, naming the row and its session.
        In a compiled layer stack one row attends by the traced path; several run eagerly
        (a graph break: the rows share their slot's static index buffers)."""
        if torch.compiler.is_compiling():
            if len(self.blocks) == 1:
                return self._attend_one_row(layer, q, k, v, extra_k, extra_v, scale)
            out: torch.Tensor = _eager_attend(self, layer, q, k, v, extra_k, extra_v, scale)
            return out
        return self._attend(layer, q, k, v, extra_k, extra_v, scale)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
                scale: float | None) -> torch.Tensor:
        if not self._accepts(layer, q, k, v, extra_k, extra_v):
            self._check_rows(layer, q, k, v, extra_k, extra_v)
            self._check_each_row(layer, q, k, v, extra_k, extra_v)
        for blk in self.blocks:
            blk.attended_layers.add(layer)
        memo = self.batch.stacked.setdefault(self.branch, {})
        return attend_rows(self.batch.cache, self._rows, layer, q, k, v, extra_k, extra_v,
                           scale, memo, self.blocks[0].is_commit)

    def _attend_one_row(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
                        scale: float | None) -> torch.Tensor:
        """A batch of one in a compiled layer stack: that row's own (traced) attend."""
        self._check_rows(layer, q, k, v, extra_k, extra_v)
        ek = None if extra_k is None else extra_k[0]
        ev = None if extra_v is None else extra_v[0]
        return self.blocks[0].attend(layer, q[0], k[0], v[0], ek, ev, scale).unsqueeze(0)

    def _accepts(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 extra_k: torch.Tensor | None, extra_v: torch.Tensor | None) -> bool:
        """Whether every row's checks would pass (False: maybe not; run them): the tensors
        once for all rows, then each row's block and layer rules."""
        first = self.blocks[0]
        if self.is_finished or not first._state.checks.accepts_rows(
                len(self.blocks), first.num_frames, q, k, v, extra_k, extra_v):
            return False
        if type(layer) is not int or not 0 <= layer < first._state.spec.num_layers:
            return False
        return all(not blk.is_finished and not blk._state._closed
                   and not blk._state._session.is_released
                   and not (blk.is_commit and layer in blk.attended_layers)
                   for blk in self.blocks)

    def _check_each_row(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        extra_k: torch.Tensor | None, extra_v: torch.Tensor | None) -> None:
        """The single attend's full checks, row by row; the first fault raises, naming its
        row and session."""
        for row, blk in enumerate(self.blocks):
            ek = None if extra_k is None else extra_k[row]
            ev = None if extra_v is None else extra_v[row]
            try:
                blk._check_all(layer, q[row], k[row], v[row], ek, ev)
            except KVStateError as error:
                raise KVStateError(f"batch attend: row {row} (session "
                                   f"{self.batch[row].session_id!r}): {error}") from error

    def _check_rows(self, layer: int, q: object, k: object, v: object, extra_k: object,
                    extra_v: object) -> None:
        """Each argument a tensor with one row per session (the rest: each row's checks)."""
        if self.is_finished:
            raise KVStateError(f"batch block on branch {self.branch!r} used after its `with` "
                               f"ended; its pages are history or free again: attend inside "
                               f"the `with states.block(...)` that made it")
        rows = len(self.blocks)
        named = (("q", q), ("k", k), ("v", v), ("extra_k", extra_k), ("extra_v", extra_v))
        for label, t in named:
            if t is None and label.startswith("extra"):
                continue
            if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != rows:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise KVStateError(f"batch attend(layer={layer}): {label} has shape {shape}; "
                                   f"expected [B={rows}, ...]: one row per session of the "
                                   f"batch")


def _eager_attend(blk: BatchBlock, layer: int, q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
                  scale: float | None) -> torch.Tensor:
    """Several rows in a compiled layer stack attend eagerly: a graph break per layer."""
    return blk._attend(layer, q, k, v, extra_k, extra_v, scale)


_eager_attend = torch.compiler.disable(_eager_attend)  # type: ignore[no-untyped-call]


if TYPE_CHECKING:  # pragma: no cover - mypy holds the classes to the contract's protocols
    _states: type[ARDiffusionKVStateBatch] = KVStateBatch
    _block: type[ARDiffusionKVBatchBlock] = BatchBlock

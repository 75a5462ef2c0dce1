"""The KV state API a pipeline sees, the same over every backend (docs/design.md#2-the-contract).

    with state.block("main", commit=False) as blk:     # a probe: writes nothing to history
        out = blk.attend(layer, q, k, v)
    with state.block("main", commit=True) as blk:      # the commit: its K/V become history
        ...
    with state.recache("main", 0, 9) as blk:            # frames 0..8 re-run; kept ones rewritten
        ...

This module checks every argument and the block lifecycle, then delegates storage to the
backend's branch and block objects (`BranchKV`, `BlockKV`), which never know about states:
a state closes itself, and a released session makes every state over it unusable. A block
entered and never exited (`state.block(...).__enter__()` alone) is given back when its
state closes: `close()` returns how to name it, so the runner can fail the forward.
"""

from __future__ import annotations

import contextlib
import time
from types import TracebackType
from typing import Any, Iterator, Literal, NamedTuple

import torch

from ardiff.contract.forward import CrossLayers
from ardiff.errors import KVStateError
from ardiff.kv.backend import BlockKV, BranchKV, KVCacheBase
from ardiff.kv.checks import TensorChecks
from ardiff.kv.session import SessionKV


class Block:
    """One block in flight on one branch; `attend` once per layer (per probe step).

    Alive only inside its `with state.block(...)`: once that ends (committed or
    not) its pages belong to the history or the pool again, and any use raises."""

    def __init__(self, state: KVState, branch: str, kv: BlockKV, num_frames: int,
                 commit: bool, kind: str = "commit") -> None:
        self._state, self._kv = state, kv
        self.branch, self.num_frames, self.is_commit = branch, num_frames, commit
        self.kind = kind if commit else "probe"  # how errors name it: commit, recache, probe
        self.attended_layers: set[int] = set()
        self.is_finished = False

    def finish(self) -> None:
        """End the block's life (its `with` is over); later use raises. Safe to call twice."""
        self.is_finished = True

    def _check_alive(self) -> None:
        self._state.check_open()
        if self.is_finished:
            raise KVStateError(f"block on branch {self.branch!r} used after its `with` ended; "
                               f"its pages are history or free again: attend inside the "
                               f"`with state.block(...)` that made it")

    @property
    def start_frame(self) -> int:
        """Absolute index of the block's first frame (its RoPE position)."""
        self._check_alive()
        return self._kv.start_frame

    @property
    def visible_frames(self) -> list[int]:
        """Absolute indices of the history frames this block attends to."""
        self._check_alive()
        return list(self._kv.visible_frames)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None = None, extra_v: torch.Tensor | None = None,
               scale: float | None = None) -> torch.Tensor:
        """Attend q to [visible history | this block's k/v | extra]; returns [q_tokens, q_heads, hs].

        q: [q_tokens, q_heads, head_size]; k, v: [num_frames * tokens_per_frame,
        num_kv_heads, head_size]; extra_k/v: [n, num_kv_heads, head_size] register
        tokens (never committed). Raises `KVStateError` on any mismatch.
        """
        if torch.compiler.is_compiling():  # a compiled layer stack: a traceable attend
            return self._traced_attend(layer, q, k, v, extra_k, extra_v, scale)
        if not self._state.checks.accepts(self, layer, q, k, v, extra_k, extra_v):
            self._check_all(layer, q, k, v, extra_k, extra_v)  # raises, naming what is wrong
        self.attended_layers.add(layer)
        return self._kv.attend(layer, q, k, v, extra_k, extra_v, scale)

    def _traced_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
                       scale: float | None) -> torch.Tensor:
        """The same checks (on the traced shapes, so once per compilation) and attend, by
        the backend's traceable path when it has one (paged: `ardiff::paged_attend`)."""
        if not self._state.checks.accepts(self, layer, q, k, v, extra_k, extra_v, traced=True):
            self._check_all(layer, q, k, v, extra_k, extra_v)
        # Recorded by writing an attribute, never reading one: a read would make the compiled
        # code guard on which layers came before (and recompile for each).
        setattr(self, f"_traced_layer_{layer}", True)
        attend = getattr(self._kv, "traced_attend", self._kv.attend)
        return attend(layer, q, k, v, extra_k, extra_v, scale)

    def _check_all(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   extra_k: torch.Tensor | None, extra_v: torch.Tensor | None) -> None:
        self._check_alive()
        self._check_layer(layer)
        checks = self._state.checks
        checks.query(layer, q)
        expected = self.num_frames * self._state.spec.tokens_per_frame
        checks.kv(layer, "k", k, expected, "num_frames * tokens_per_frame")
        checks.kv(layer, "v", v, expected, "num_frames * tokens_per_frame")
        checks.extra(layer, extra_k, extra_v)

    def _check_layer(self, layer: int) -> None:
        num_layers = self._state.spec.num_layers
        if not (isinstance(layer, int) and not isinstance(layer, bool)
                and 0 <= layer < num_layers):
            raise KVStateError(f"attend: layer {layer!r} is out of range 0..{num_layers - 1}")
        if self.is_commit and layer in self.attended_layers:
            raise KVStateError(f"attend: layer {layer} attended twice in one {self.kind} block "
                               f"of branch {self.branch!r}; a {self.kind} calls attend once "
                               f"per layer")

    def check_complete(self) -> None:
        traced = {layer for layer in range(self._state.spec.num_layers)
                  if self.__dict__.get(f"_traced_layer_{layer}")}
        missing = sorted(set(range(self._state.spec.num_layers)) - self.attended_layers - traced)
        if missing:
            raise KVStateError(f"{self.kind} block of branch {self.branch!r} ended without "
                               f"attending layers {missing}; a {self.kind} must attend every "
                               f"layer once")


STAGES = {False: "denoise", True: "commit"}  # a timeline's stages: probe blocks, the commit


class BlockScope:
    """The `with` of `state.block(...)`: entering checks and opens the block (claiming the
    slot), leaving commits it (a clean commit) or gives it back (a probe, an exception).
    A class rather than a generator: it runs five times per AR block of a 4-step model."""

    __slots__ = ("state", "branch", "commit", "num_frames", "slot", "kv", "blk", "started")
    slot: int
    kv: BlockKV
    blk: Block

    def __init__(self, state: KVState, branch: str, commit: bool,
                 num_frames: int | None) -> None:
        self.state, self.branch, self.commit, self.num_frames = state, branch, commit, num_frames

    def __enter__(self) -> Block:
        state, branch = self.state, self.branch
        state.check_open()
        num_frames = state._check_num_frames(self.num_frames)
        slot = state._session.check_slot(branch)
        state._check_positions(branch, num_frames)  # before the slot is claimed: all or nothing
        history: BranchKV = state._session.branch(branch)
        state._cache.open_slot(slot, branch)
        try:
            self.kv = history.begin(num_frames, self.commit)
        except BaseException:
            state._cache.close_slot(slot)
            raise
        self.slot = slot
        self.blk = Block(state, branch, self.kv, num_frames, self.commit)
        state._in_flight_blocks.append(InFlight(self.blk, self.kv, slot))
        self.started = time.perf_counter()
        return self.blk

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> Literal[False]:
        if self.blk.is_finished:  # given back when its state closed: that state is over
            self.state.check_open()
            return False
        try:
            self.state._finish(self.blk, self.kv, failed=exc_type is not None)
        finally:
            self.state._left(self.blk)
            self.state._cache.close_slot(self.slot)
            self.state.stage_s[STAGES[self.commit]] += time.perf_counter() - self.started
        return False


class InFlight(NamedTuple):
    """A block between its `with`'s enter and exit: what `KVState.close` gives back if the
    exit never comes."""

    blk: Block
    kv: BlockKV
    slot: int

    def give_back(self, cache: KVCacheBase[Any]) -> str:
        """Commit nothing: its pages go back to the pool, its slot is free; returns its name."""
        self.blk.finish()
        try:
            self.kv.abort()
        finally:
            cache.close_slot(self.slot)
        return f"a {self.blk.kind} block of branch {self.blk.branch!r}"


def open_state(cache: KVCacheBase[Any], session_id: str) -> KVState:
    """A state over `session_id`, opening the session if it is new (capacity permitting)."""
    return KVState(cache, cache.open_session(session_id))


class KVState:
    """A pipeline's handle on one session's KV, valid only while bound
    (docs/design.md#2-the-contract).

    Implements `ardiff.ARDiffusionKVState`."""

    def __init__(self, cache: KVCacheBase[Any], session: SessionKV[Any]) -> None:
        self._cache, self._session = cache, session
        self.session_id = session.session_id
        self.spec = cache.spec
        self.checks = TensorChecks(cache.spec, cache.torch_dtype, cache.device)
        self._closed = False
        self._in_flight_blocks: list[InFlight] = []  # entered, not yet exited
        self.stage_s = dict.fromkeys(STAGES.values(), 0.0)  # host s (on CUDA: to queue them)

    def close(self) -> list[str]:
        """End the bind; any later use raises. Safe to call twice. A block still in flight
        (entered, never exited) is given back: nothing of it is committed, its pages return
        to the pool. Returns how to name each such block (none: [])."""
        self._closed = True
        given_back = []
        while self._in_flight_blocks:
            given_back.append(self._in_flight_blocks.pop().give_back(self._cache))
        return given_back[::-1]

    def _left(self, blk: Block) -> bool:
        """`blk`'s `with` ended (by any path): it is no longer in flight. False: it was not
        (`close` gave it back before)."""
        before = len(self._in_flight_blocks)
        self._in_flight_blocks = [f for f in self._in_flight_blocks if f.blk is not blk]
        return len(self._in_flight_blocks) < before

    def check_open(self) -> None:
        if self._closed or self._session.is_released:
            raise KVStateError(f"KV state of session {self.session_id!r} used after its bind "
                               f"ended or the session was released; use the state passed to "
                               f"this generate_block call")

    def num_committed_frames(self, branch: str) -> int:
        """Frames committed on `branch` so far: the absolute position of the next frame."""
        self.check_open()
        self._session.check_slot(branch)
        return self._session.num_committed_frames(branch)

    def block(self, branch: str, commit: bool = False,
              num_frames: int | None = None) -> BlockScope:
        """Open a block on `branch`; with `commit=True` its K/V become history on a clean exit.
        A context manager: nothing happens until its `with` is entered."""
        return BlockScope(self, branch, commit, num_frames)

    @contextlib.contextmanager
    def recache(self, branch: str, start_frame: int,
                num_frames: int | None = None) -> Iterator[Block]:
        """Re-run committed frames [start_frame, start_frame + n) of `branch` in one forward
        at their own positions, e.g. under a new prompt (LongLive's KV recache). n:
        num_frames, default frames_per_block; any count of committed frames.

        The block has `state.block`'s API and rules (`attend` once per layer, one block in
        flight per local slot, dead after its `with`). It attends to the kept frames before
        `start_frame` (`visible_frames`: a sink before the range keeps its K/V) plus all n
        frames, with no mask among them. On a clean exit the frames of the range that
        `branch` still keeps get their new K/V; the others (evicted) were context for the
        forward only. It commits no new frame, evicts nothing and leaves
        `num_committed_frames` as it was; on an exception nothing changes. Until its end
        it holds the new K/V of the kept frames it rewrites (outside the page pool).
        Raises `KVStateError` unless the n frames are committed and one of them is kept."""
        self.check_open()
        slot = self._session.claim_slot(branch)
        history: BranchKV = self._session.branch(branch)
        num_frames = self._check_recache(branch, history, start_frame, num_frames)
        self._cache.open_slot(slot, branch)
        try:
            kv = history.begin_recache(start_frame, num_frames)
        except BaseException:
            self._cache.close_slot(slot)
            raise
        blk = Block(self, branch, kv, num_frames, True, "recache")
        self._in_flight_blocks.append(InFlight(blk, kv, slot))
        try:
            yield from self._run(blk, kv)
        finally:
            if self._left(blk):  # else `close` gave it back, its slot with it
                self._cache.close_slot(slot)

    def _finish(self, blk: Block, kv: BlockKV, failed: bool) -> None:
        """End a block: commit it on a clean exit (if it commits), else give it back."""
        try:
            if not failed and blk.is_commit:
                self.check_open()  # a released session's table must not take pages
                blk.check_complete()
        except BaseException:
            failed = True
            raise
        finally:
            blk.finish()
            if failed:
                kv.abort()
        if not failed:
            kv.commit() if blk.is_commit else kv.abort()

    def _run(self, blk: Block, kv: BlockKV) -> Iterator[Block]:
        """Yield the block; on a clean exit commit it (if it commits), else give it back."""
        try:
            yield blk
            if blk.is_commit:
                self.check_open()  # a released session's table must not take pages
                blk.check_complete()
        except BaseException:
            if not blk.is_finished:  # (`close` gave back one whose `with` never ended)
                blk.finish()
                kv.abort()
            raise
        blk.finish()
        kv.commit() if blk.is_commit else kv.abort()

    def kept_frames(self, branch: str) -> list[int]:
        """Absolute indices of the frames `branch` holds now, in order: the history the next
        block attends to (docs/design.md#3-what-a-block-sees), and the frames `recache` may
        re-commit."""
        self.check_open()
        self._session.check_slot(branch)
        kv = self._session.branches.get(branch)
        return [] if kv is None else list(kv.kept_frames)

    def _check_recache(self, branch: str, history: BranchKV, start_frame: object,
                       num_frames: object) -> int:
        """The recache's frame count, once its range is committed and holds a kept frame."""
        if not (isinstance(start_frame, int) and not isinstance(start_frame, bool)):
            raise KVStateError(f"recache: start_frame={start_frame!r} is not a frame index; "
                               f"pass an int from state.kept_frames({branch!r})")
        n = self.spec.frames_per_block if num_frames is None else num_frames
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise KVStateError(f"recache: num_frames={num_frames!r} is not a frame count; "
                               f"pass an int >= 1")
        committed, kept = history.num_committed_frames, history.kept_frames
        frames = _span([start_frame, start_frame + n - 1][:1 if n == 1 else 2])
        if start_frame < 0 or start_frame + n > committed:
            done = f"0..{committed - 1}" if committed else "none"
            raise KVStateError(f"recache on branch {branch!r}: frames {frames} are not "
                               f"all committed (committed: {done}); a recache re-runs frames "
                               f"the branch has made")
        if not any(start_frame <= frame < start_frame + n for frame in kept):
            raise KVStateError(f"recache on branch {branch!r}: none of frames {frames} "
                               f"is kept (kept: {_spans(kept)}); a recache rewrites kept "
                               f"frames: include one of state.kept_frames({branch!r})")
        return n

    def _check_positions(self, branch: str, num_frames: int) -> None:
        """Positions are absolute: a block past `max_model_len` would index past the model's
        position tables, so it is refused here too, not only by the rollout's plan."""
        start = self._session.num_committed_frames(branch)
        limit = self.spec.max_model_len
        if start + num_frames > limit:
            last = start + num_frames - 1
            raise KVStateError(f"block on branch {branch!r} at frames {start}..{last} passes the "
                               f"spec's max_model_len={limit}; reset the session (or close it) "
                               f"before it reaches {limit} frames")

    def _check_num_frames(self, num_frames: int | None, what: str = "block") -> int:
        limit = self.spec.frames_per_block
        if num_frames is None:
            return limit
        if not (isinstance(num_frames, int) and not isinstance(num_frames, bool)
                and 1 <= num_frames <= limit):
            raise KVStateError(f"{what}: num_frames={num_frames!r} is out of range "
                               f"1..frames_per_block={limit}")
        return num_frames

    def cross_kv(self, branch: str, name: str) -> CrossLayers | None:
        """The (k, v) per layer stored for `name` on `branch`, or None if not set."""
        self.check_open()
        self._session.check_branch(branch)
        return self._cache.cross.get(self.session_id, branch, name)

    def set_cross_kv(self, branch: str, name: str, layers: CrossLayers) -> None:
        """Store `[L, heads, head_size]` (k, v) for every layer; all or nothing."""
        self.check_open()
        self._session.check_slot(branch)
        self._cache.cross.set(self.session_id, branch, name, layers)
        self._session.claim_slot(branch)

    def clear_cross_kv(self, branch: str, names: list[str] | None = None) -> None:
        """Drop cross-attention K/V (e.g. on a prompt switch); history stays."""
        self.check_open()
        self._session.check_branch(branch)
        self._cache.cross.clear(self.session_id, branch, names)


def _span(frames: list[int]) -> str:
    return str(frames[0]) if len(frames) == 1 else f"{frames[0]}..{frames[-1]}"


def _spans(frames: list[int]) -> str:
    """`0..2, 9..14`: sorted frame indices as runs (`none` if empty)."""
    runs: list[list[int]] = []
    for frame in frames:
        if runs and runs[-1][-1] + 1 == frame:
            runs[-1].append(frame)
        else:
            runs.append([frame])
    return ", ".join(_span(run) for run in runs) or "none"

"""The batched block (ardiff/kv/batch.py, docs/design.md#batched-blocks): each row attends to
its own session's history, within FLOAT_RELATIVE of row-by-row single attends (another batch
size may take another kernel), and paged (NaN-poisoned)
equals dense under batching; every misuse is a typed error naming the row and its session."""

from __future__ import annotations

import random

import pytest
import torch
from kvdrive import BIG_BUDGET_BYTES, CFG_BRANCHES, WindowModel, check_pool, make_spec
from numerics import FLOAT_RELATIVE, assert_floats_close

from ardiff.dtypes import DTYPE_BYTES
from ardiff.dtypes import torch_dtype as plan_dtype
from ardiff.errors import KVStateError
from ardiff.kv import backend as backend_module
from ardiff.kv.backend import create_cache
from ardiff.kv.batch import KVStateBatch
from ardiff.kv.plan import make_plan
from ardiff.kv.state import open_state

ARMS = ("paged", "dense", "single")  # batched paged, batched dense, paged one row at a time


def plan_(spec, rows, page_tokens=None, max_sessions=None, dtype="float32"):
    return make_plan(spec, dtype, DTYPE_BYTES[dtype], BIG_BUDGET_BYTES, page_tokens,
                     max_sessions, batch_rows=rows)


class BatchRig:
    """The same blocks on three caches: batched paged (poisoned), batched dense, and paged
    (poisoned) attended row by row with today's single `state.block`, the reference."""

    def __init__(self, spec, rows: int, page_tokens=None, seed=0, registers=0,
                 q_head_factor=2, device="cpu", dtype="float32",
                 atol=FLOAT_RELATIVE) -> None:
        self.spec, self.registers, self.atol = spec, registers, atol
        plan = plan_(spec, rows, page_tokens, dtype=dtype)
        self.caches = {arm: create_cache(plan, "dense" if arm == "dense" else "paged",
                                         device, poison=arm != "dense") for arm in ARMS}
        self.device, self.dtype = torch.device(device), plan_dtype(dtype)
        self.q_heads = spec.num_kv_heads * q_head_factor
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)
        self.models: dict[tuple[str, str], WindowModel] = {}
        self.num_attends = 0

    def _randn(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(self.device, self.dtype)

    def _inputs(self, rows: int, num_frames: int) -> dict:
        s = self.spec
        tokens = num_frames * s.tokens_per_frame
        args = dict(q=self._randn(rows, tokens, self.q_heads, s.head_size),
                    k=self._randn(rows, tokens, s.num_kv_heads, s.head_size),
                    v=self._randn(rows, tokens, s.num_kv_heads, s.head_size))
        if self.registers:
            n = self.rng.randint(1, self.registers)
            args["extra_k"] = self._randn(rows, n, s.num_kv_heads, s.head_size)
            args["extra_v"] = self._randn(rows, n, s.num_kv_heads, s.head_size)
        if self.rng.random() < 0.3:
            args["scale"] = 0.3
        return args

    def block(self, sids: list[str], commit: bool, branch: str = "main",
              num_frames: int | None = None) -> None:
        """One block of every session in `sids` on every arm; outputs compared layer by layer."""
        frames = num_frames or self.spec.frames_per_block
        layers = self.rng.sample(range(self.spec.num_layers), self.spec.num_layers)
        inputs = [self._inputs(len(sids), frames) for _ in layers]
        outs = {arm: self._batched(arm, sids, commit, branch, num_frames, layers, inputs)
                for arm in ("paged", "dense")}
        outs["single"] = self._rows(sids, commit, branch, num_frames, layers, inputs)
        for i, layer in enumerate(layers):
            assert not torch.isnan(outs["paged"][i]).any(), "a batched row read a poisoned page"
            # Stacked rows may run another kernel than one row (another batch size): a bound.
            torch.testing.assert_close(outs["paged"][i], outs["single"][i], rtol=0,
                                       atol=self.atol)
            assert torch.equal(outs["dense"][i], outs["paged"][i]), f"layer {layer}"
            self.num_attends += 1
        if commit:
            for sid in sids:
                self.model(sid, branch).commit(frames)
        for arm in ("paged", "single"):
            check_pool(self.caches[arm])

    def _batched(self, arm, sids, commit, branch, num_frames, layers, inputs):
        states = KVStateBatch([open_state(self.caches[arm], sid) for sid in sids])
        try:
            with states.block(branch, commit=commit, num_frames=num_frames) as blk:
                self._check_positions(sids, branch, blk.start_frames, blk.visible_frames)
                return [blk.attend(layer, **args) for layer, args in zip(layers, inputs)]
        finally:
            for state in states:
                state.close()

    def _rows(self, sids, commit, branch, num_frames, layers, inputs):
        outs = [[] for _ in layers]
        for row, sid in enumerate(sids):
            state = open_state(self.caches["single"], sid)
            with state.block(branch, commit=commit, num_frames=num_frames) as blk:
                for i, (layer, args) in enumerate(zip(layers, inputs)):
                    row_args = {key: t[row] if isinstance(t, torch.Tensor) else t
                                for key, t in args.items()}
                    outs[i].append(blk.attend(layer, **row_args))
            state.close()
        return [torch.stack(out) for out in outs]

    def model(self, sid: str, branch: str) -> WindowModel:
        return self.models.setdefault((sid, branch), WindowModel.of(self.spec))

    def _check_positions(self, sids, branch, start_frames, visible_frames):
        for row, sid in enumerate(sids):
            model = self.model(sid, branch)
            assert start_frames[row] == model.n
            assert visible_frames[row] == model.visible, (sid, model.n)

    def ar_block(self, sids: list[str], probes: int = 2, **kw) -> None:
        for _ in range(probes):
            self.block(sids, commit=False, **kw)
        self.block(sids, commit=True, **kw)

    def release(self, sid: str) -> None:
        for cache in self.caches.values():
            cache.release_session(sid)
        for key in [key for key in self.models if key[0] == sid]:
            del self.models[key]


SPECS = {
    # sink 1, registers, GQA (q heads 2x kv heads), a page smaller than a frame
    "sink-registers": dict(spec=dict(num_layers=2, num_kv_heads=2, head_size=8,
                                     tokens_per_frame=5, frames_per_block=2, window_frames=6,
                                     sink_frames=1, registers=3), page_tokens=3),
    # no sink, plain heads, tumbling window, one page per frame
    "nosink-tumbling": dict(spec=dict(num_layers=2, num_kv_heads=2, head_size=4,
                                      tokens_per_frame=3, frames_per_block=1, window_frames=4,
                                      reset_at_boundary=True), page_tokens=3, factor=1),
}


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
@pytest.mark.parametrize("case", sorted(SPECS))
def test_batched_rows_equal_single_attends_and_paged_equals_dense(case, rows):
    """Sessions that joined at different blocks (one past its first eviction), probes and
    commits, one session released and restarted midway: ragged histories throughout."""
    setup = SPECS[case]
    spec = make_spec(**setup["spec"], session_capacity=rows + 1)
    rig = BatchRig(spec, rows, setup["page_tokens"], seed=rows,
                   registers=setup["spec"].get("registers", 0),
                   q_head_factor=setup.get("factor", 2))
    sids = [f"s{row}" for row in range(rows)]
    evicts_after = -(-(spec.sink_frames + spec.window_frames) // spec.frames_per_block) + 1
    for row, sid in enumerate(sids):  # alone first: row r is r blocks ahead, row 0 evicted
        for _ in range(evicts_after if row == 0 else row % 4):
            rig.ar_block([sid], probes=1)
    for step in range(4):
        rig.ar_block(sids, probes=1 + step % 2)
        if step == 1 and rows > 1:  # a session reset in the middle: back at frame 0
            rig.release(sids[-1])
    assert rig.num_attends > 0
    counts = {len(rig.model(sid, "main").visible) for sid in sids}
    assert rows == 1 or len(counts) > 1, "the histories were meant to be ragged"
    for sid in sids:
        rig.release(sid)
    assert rig.caches["paged"].pool.num_used == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_rows_on_cuda(dtype):
    """On CUDA the stacked rows run the kernel's batched form (flash-attn's, where it is
    the cache's kernel) and a single row the cache's own kernel: within 2e-2 in bf16 and
    1e-5 in fp32 of row-by-row attends; paged still equals dense exactly."""
    spec = make_spec(num_layers=2, num_kv_heads=2, head_size=64, tokens_per_frame=8,
                     frames_per_block=2, window_frames=6, sink_frames=1, session_capacity=5)
    rig = BatchRig(spec, 4, seed=4, device="cuda", dtype=dtype,
                   atol=2e-2 if dtype == "bfloat16" else 1e-5)
    sids = [f"s{row}" for row in range(4)]
    for row, sid in enumerate(sids):
        for _ in range(row):
            rig.ar_block([sid], probes=0)
    for _ in range(5):
        rig.ar_block(sids, probes=1)
    for sid in sids:
        rig.release(sid)


def test_partial_blocks_cfg_branches_and_split_groups_stay_exact(monkeypatch):
    """num_frames < frames_per_block, a second branch, and stacked groups cut small (each
    group of equal key count split into pairs) or no stacked kernel at all."""
    spec = make_spec(num_layers=2, num_kv_heads=1, head_size=4, tokens_per_frame=3,
                     frames_per_block=2, window_frames=5, sink_frames=1,
                     kv_branches=CFG_BRANCHES, session_capacity=6)
    rig = BatchRig(spec, 5, page_tokens=2, seed=5)
    sids = [f"s{row}" for row in range(5)]
    pair_bytes = 2 * 2 * 4 * (spec.sink_frames + spec.window_frames) * spec.tokens_per_frame
    monkeypatch.setattr(backend_module, "STACKED_MAX_BYTES", pair_bytes)
    for branch in ("positive", "negative"):
        for _ in range(4):
            rig.ar_block(sids, branch=branch)
            rig.ar_block(sids, branch=branch, num_frames=1)
    for arm in ("paged", "dense"):
        monkeypatch.setattr(rig.caches[arm], "stacked_fn", None)
    rig.ar_block(sids, branch="positive")


# -- misuse --------------------------------------------------------------------------------

L, H, HS, TPF = 2, 2, 4, 3


def spec_(**kw):
    base = dict(num_layers=L, num_kv_heads=H, head_size=HS, tokens_per_frame=TPF,
                frames_per_block=1, window_frames=3, sink_frames=1, registers=2,
                session_capacity=4)
    return make_spec(**{**base, **kw})


def batch_(cache, sids):
    return KVStateBatch([open_state(cache, sid) for sid in sids])


def qkv(rows, num_frames=1):
    tokens = num_frames * TPF
    return (torch.randn(rows, tokens, 2 * H, HS), torch.randn(rows, tokens, H, HS),
            torch.randn(rows, tokens, H, HS))


def commit_all(states):
    with states.block("main", commit=True) as blk:
        for layer in range(L):
            blk.attend(layer, *qkv(len(states)))


@pytest.fixture(params=["paged", "dense"])
def cache(request):
    return create_cache(plan_(spec_(), rows=3), request.param, poison=True)


def test_a_batch_of_the_same_session_twice_is_refused(cache):
    with pytest.raises(KVStateError, match=r"KVStateBatch: session 'a' is in rows 0 and 2; "
                                           r"a batch holds each session once"):
        KVStateBatch([open_state(cache, "a"), open_state(cache, "b"), open_state(cache, "a")])


def test_states_over_two_caches_are_refused(cache):
    other = create_cache(cache.plan, "paged")
    with pytest.raises(KVStateError, match=r"row 1 \(session 'b'\) is over another cache "
                                           r"than row 0 \(session 'a'\)"):
        KVStateBatch([open_state(cache, "a"), open_state(other, "b")])


def test_an_empty_batch_or_a_closed_state_is_refused(cache):
    with pytest.raises(KVStateError, match=r"no states"):
        KVStateBatch([])
    closed = open_state(cache, "b")
    closed.close()
    with pytest.raises(KVStateError, match=r"state of session 'b' used after its bind ended"):
        KVStateBatch([open_state(cache, "a"), closed])


def test_the_sequence_api_and_per_row_state(cache):
    states = batch_(cache, ["a", "b"])
    assert len(states) == 2 and [s.session_id for s in states] == ["a", "b"]
    assert states[1].session_id == "b"
    commit_all(states)
    assert [s.num_committed_frames("main") for s in states] == [1, 1]


def test_rows_that_mismatch_the_batch_name_the_argument(cache):
    states = batch_(cache, ["a", "b", "c"])
    q, k, v = qkv(3)
    with states.block("main") as blk:
        with pytest.raises(KVStateError, match=r"batch attend\(layer=0\): k has shape "
                                               r"\(2, 3, 2, 4\); expected \[B=3, \.\.\.\]"):
            blk.attend(0, q, k[:2], v)
        with pytest.raises(KVStateError, match=r"q has shape list; expected \[B=3"):
            blk.attend(0, [q], k, v)
        with pytest.raises(KVStateError, match=r"row 0 \(session 'a'\): attend\(layer=0\): q "
                                               r"is torch.float64; expected torch.float32"):
            blk.attend(0, q.double(), k, v)
        with pytest.raises(KVStateError, match=r"row 0 \(session 'a'\): attend: layer 5 is out "
                                               r"of range 0..1"):
            blk.attend(5, q, k, v)
        with pytest.raises(KVStateError, match=r"row 0 \(session 'a'\): attend\(layer=1\): "
                                               r"pass both extra_k and extra_v or neither"):
            blk.attend(1, q, k, v, extra_k=torch.randn(3, 1, H, HS))


def test_a_layer_twice_in_a_commit_names_the_first_row(cache):
    states = batch_(cache, ["a", "b"])
    with pytest.raises(KVStateError, match=r"row 0 \(session 'a'\): attend: layer 1 attended "
                                           r"twice in one commit block"):
        with states.block("main", commit=True) as blk:
            blk.attend(1, *qkv(2))
            blk.attend(1, *qkv(2))
    assert [s.num_committed_frames("main") for s in states] == [0, 0]


def test_a_row_whose_state_closed_is_named(cache):
    states = batch_(cache, ["a", "b"])
    with pytest.raises(KVStateError, match=r"row 1 \(session 'b'\): KV state of session 'b' "
                                           r"used after its bind ended"):
        with states.block("main") as blk:
            states[1].close()
            blk.attend(0, *qkv(2))


def test_attend_after_the_with_raises(cache):
    states = batch_(cache, ["a", "b"])
    with states.block("main", commit=False) as blk:
        blk.attend(0, *qkv(2))
    with pytest.raises(KVStateError, match=r"batch block on branch 'main' used after its "
                                           r"`with` ended"):
        blk.attend(1, *qkv(2))
    with pytest.raises(KVStateError, match=r"used after its `with` ended"):
        blk.start_frames


def test_an_incomplete_commit_ends_every_row_and_names_the_first(cache):
    states = batch_(cache, ["a", "b", "c"])
    with pytest.raises(KVStateError, match=r"batch block on branch 'main': row 0 \(session "
                                           r"'a'\): commit block of branch 'main' ended without "
                                           r"attending layers \[1\]; .* \(2 other rows failed "
                                           r"too\)"):
        with states.block("main", commit=True) as blk:
            blk.attend(0, *qkv(3))
    assert [s.num_committed_frames("main") for s in states] == [0, 0, 0]
    if cache.backend_name == "paged":
        assert cache.pool.num_used == 0
    commit_all(states)  # every row's slot is free again


def test_an_exception_inside_commits_no_row(cache):
    states = batch_(cache, ["a", "b"])
    commit_all(states)
    used = cache.pool.num_used if cache.backend_name == "paged" else None
    with pytest.raises(RuntimeError, match="boom"):
        with states.block("main", commit=True) as blk:
            for layer in range(L):
                blk.attend(layer, *qkv(2))
            raise RuntimeError("boom")
    assert [s.num_committed_frames("main") for s in states] == [1, 1]
    if used is not None:
        assert cache.pool.num_used == used


def test_a_row_that_cannot_enter_leaves_no_page_in_use():
    """Three rows on a plan for two: row 2's in-flight pages are not there. Rows 0 and 1
    are given back, the error names session 'c', and the slots are free again."""
    spec = spec_(session_capacity=3)
    cache = create_cache(plan_(spec, rows=2, max_sessions=3), "paged", poison=True)
    for sid in "abc":  # every session's window full: the pool's free pages are in-flight's
        state = open_state(cache, sid)
        for _ in range(spec.window_frames + 1):
            commit_all(KVStateBatch([state]))
    used = cache.pool.num_used
    states = batch_(cache, ["a", "b", "c"])
    with pytest.raises(KVStateError, match=r"batch block on branch 'main': row 2 \(session "
                                           r"'c'\): page pool exhausted allocating 1 in-flight "
                                           r"pages \(0 free of 11\); .* a plan for batch_rows "
                                           r">= B, this one is for 2\)"):
        with states.block("main", commit=True):
            pass
    assert cache.pool.num_used == used
    check_pool(cache)
    commit_all(batch_(cache, ["a", "b"]))  # nothing left open on the slot
    commit_all(batch_(cache, ["c"]))
    assert [states[i].num_committed_frames("main") for i in range(3)] == [5, 5, 5]


def test_a_single_block_cannot_open_beside_a_batch_row():
    cache = create_cache(plan_(spec_(), rows=2), "paged")
    states = batch_(cache, ["a", "b"])
    with states.block("main"):
        with pytest.raises(KVStateError, match=r"local slot 0 .* is still open"):
            with open_state(cache, "c").block("main"):
                pass
    with pytest.raises(KVStateError, match=r"row 1 \(session 'b'\): block on branch 'main': "
                                           r"a block on local slot 0 \('main'\) is still open"):
        with states[0].block("main"):
            with states.block("main"):
                pass
    commit_all(states)


@pytest.mark.parametrize("rows", [
    pytest.param(1, marks=[pytest.mark.slow, pytest.mark.heavy]),  # ~2 s: traces the op
    2,
])
def test_a_compiled_layer_stack_attends_a_batch(rows):
    """One row takes the traced path (`ardiff::paged_attend`); several attend eagerly (a
    graph break). Both equal the eager batch."""
    torch._dynamo.reset()
    spec = spec_()
    caches = [create_cache(plan_(spec, rows=rows), "paged", poison=True) for _ in range(2)]

    def layers(q, k, v, extra, blk):
        for layer in range(L):
            q = q + blk.attend(layer, q, k, v, extra, extra)
        return q

    compiled = torch.compile(layers, backend="aot_eager" if rows == 1 else "eager")
    sids = [f"s{row}" for row in range(rows)]
    for _ in range(2):  # the history grows
        (q, k, v), extra = qkv(rows), torch.randn(rows, 2, H, HS)
        outs = []
        for fn, cache in zip((layers, compiled), caches):
            with batch_(cache, sids).block("main", commit=True) as blk:
                outs.append(fn(q, k, v, extra, blk))
        assert not torch.isnan(outs[1]).any()
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert caches[1].num_committed_frames("s0", "main") == 2


# -- one batch over several blocks: its stacked K/V kept while histories stay (#26) ---------

def test_one_batch_across_probes_commits_and_recaches_reads_each_blocks_history():
    """A KVStateBatch reused block after block (as a pipeline's probes and commit are) keeps
    each layer's stacked K/V between attends; a commit, a recache or a row's own single
    block in between must show in the next attend, exactly as fresh row-by-row attends."""
    torch.manual_seed(3)
    sids = ["a", "b", "c"]
    caches = {arm: create_cache(plan_(spec_(), rows=3), backend, poison=backend == "paged")
              for arm, backend in (("paged", "paged"), ("dense", "dense"), ("single", "paged"))}
    batches = {arm: batch_(caches[arm], sids) for arm in ("paged", "dense")}

    def block(commit):
        inputs = [qkv(3) + (torch.randn(3, 2, H, HS), torch.randn(3, 2, H, HS))
                  for _ in range(L)]
        outs = {}
        for arm, states in batches.items():
            with states.block("main", commit=commit) as blk:
                outs[arm] = [blk.attend(layer, q, k, v, ek, ev)
                             for layer, (q, k, v, ek, ev) in enumerate(inputs)]
        single = []
        for row, sid in enumerate(sids):
            state = open_state(caches["single"], sid)
            with state.block("main", commit=commit) as blk:
                single.append([blk.attend(layer, q[row], k[row], v[row], ek[row], ev[row])
                               for layer, (q, k, v, ek, ev) in enumerate(inputs)])
            state.close()
        for layer in range(L):
            want = torch.stack([single[row][layer] for row in range(3)])
            assert_floats_close(outs["paged"][layer], want, f"layer {layer}")
            assert torch.equal(outs["dense"][layer], outs["paged"][layer]), layer

    def on_every_cache(act):  # the same change to one row's session on every cache
        q, k, v = qkv(1)
        for arm in ("paged", "dense", "single"):
            states = batches.get(arm)
            state = states[1] if states is not None else open_state(caches[arm], "b")
            with act(state) as blk:
                for layer in range(L):
                    blk.attend(layer, q[0], k[0], v[0])
            if states is None:
                state.close()

    def row_commit(state):
        return state.block("main", commit=True)

    def row_recache(state):
        return state.recache("main", state.num_committed_frames("main") - 1)

    for _ in range(4):       # history for every row, through the window and past it
        block(commit=False)
        block(commit=False)
        block(commit=True)
    on_every_cache(row_commit)   # row 1 alone moves on: its history is another now
    block(commit=False)
    block(commit=False)
    on_every_cache(row_recache)  # row 1's last frame rewritten in place: same pages
    block(commit=False)
    block(commit=True)
    for states in batches.values():
        for state in states:
            state.close()

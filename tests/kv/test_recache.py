"""`state.recache`: committed frames re-run in one forward at their own positions; the kept ones
rewritten, the evicted ones context only; paged (poisoned) = dense, and both = attention by hand."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from kvdrive import CFG_BRANCHES, InjectedFailure, Lockstep, check_pool, make_spec

from ardiff.errors import KVStateError
from ardiff.kv.attention import attend
from ardiff.kv.state import open_state


def stored_kv(cache, session_id: str, branch: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V a branch holds for `layer`, [kept tokens, heads, head_size], kept frames in order."""
    kv = cache._sessions[session_id].branches[branch]
    if cache.backend_name == "dense":
        return kv.k[layer], kv.v[layer]
    storage = cache.storage
    return storage.read(layer, storage.frames_address(kv.table.visible_pages))


def frame_rows(kept: list[int], frames: list[int], tpf: int) -> torch.Tensor:
    """Rows of `frames` among the stored K/V of `kept` (kept order)."""
    return torch.tensor([kept.index(f) * tpf + t for f in frames for t in range(tpf)],
                        dtype=torch.long)


def recache(lock: Lockstep, session_id: str, branch: str, start: int, num_frames: int,
            fail_after: int | None = None) -> None:
    """One recache on both caches, checked three ways: paged = dense per attend; each
    attend = attention by hand over [stored K/V of the kept frames before `start` | all of
    its own k/v] (no mask); after it, the kept frames of the range hold its k/v, the rest
    of the history is as it was."""
    spec, tpf = lock.spec, lock.spec.tokens_per_frame
    kept = lock.model(session_id, branch).visible
    before = {c.backend_name: [stored_kv(c, session_id, branch, layer)
                               for layer in range(spec.num_layers)] for c in lock.caches}
    seen = [f for f in kept if f < start]
    rewritten = [f for f in kept if start <= f < start + num_frames]
    states = [open_state(cache, session_id) for cache in lock.caches]
    written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        with contextlib.ExitStack() as stack:
            pair = [stack.enter_context(st.recache(branch, start, num_frames)) for st in states]
            for blk in pair:
                assert (blk.start_frame, blk.visible_frames) == (start, seen)
            for attends, layer in enumerate(lock.rng.sample(range(spec.num_layers),
                                                            spec.num_layers)):
                if attends == fail_after:
                    raise InjectedFailure
                args = lock.inputs.attend_args(num_frames)
                outs = [blk.attend(layer, **args) for blk in pair]
                old_k, old_v = before["dense"][layer]
                rows = frame_rows(kept, seen, tpf)
                keys = [old_k[rows], args["k"]] + [args[e] for e in ("extra_k",) if e in args]
                values = [old_v[rows], args["v"]] + [args[e] for e in ("extra_v",) if e in args]
                expected = attend(args["q"], torch.cat(keys), torch.cat(values),
                                  args.get("scale"))
                assert not torch.isnan(outs[0]).any(), "paged attention read a poisoned page"
                torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
                torch.testing.assert_close(outs[0], expected, rtol=1e-6, atol=1e-6)
                own = torch.tensor([(f - start) * tpf + t for f in rewritten for t in range(tpf)],
                                   dtype=torch.long)
                written[layer] = (args["k"][own], args["v"][own])
            if fail_after is not None:
                raise InjectedFailure
    finally:
        for state in states:
            state.close()
    check_pool(lock.paged)
    for cache in lock.caches:
        for layer in range(spec.num_layers):
            old = before[cache.backend_name][layer]
            now = stored_kv(cache, session_id, branch, layer)
            changed = frame_rows(kept, rewritten if fail_after is None else [], tpf)
            same = frame_rows(kept, [f for f in kept if f not in rewritten
                                     or fail_after is not None], tpf)
            for i in range(2):
                torch.testing.assert_close(now[i][same], old[i][same], rtol=0, atol=0)
                if len(changed):
                    torch.testing.assert_close(now[i][changed], written[layer][i], rtol=0, atol=0)


def longlive_range(lock: Lockstep, session_id: str, branch: str) -> tuple[int, int]:
    """LongLive's switch at T committed frames (sink S, window W): frames [0, T) while
    T <= S + W, else the last W frames (the sink before them keeps its K/V)."""
    spec, n = lock.spec, lock.model(session_id, branch).n
    if n <= spec.sink_frames + spec.window_frames:
        return 0, n
    return n - spec.window_frames, spec.window_frames


CASES = [  # (sink, window, frames_per_block, tokens_per_frame, page_tokens, cfg, registers)
    (3, 9, 3, 4, 4, False, 0),   # LongLive's shape: sink 3, window 9, blocks of 3
    (1, 4, 2, 5, 3, False, 3),   # page_tokens does not divide the frame; registers
    (2, 5, 2, 4, 2, True, 0),    # CFG, two pages per frame
    (0, 6, 3, 3, 2, False, 2),   # no sink
    (2, 3, 1, 5, 1, False, 0),   # one token per page, blocks of one frame
]


@pytest.mark.parametrize("reset_at_boundary", [False, True], ids=["sliding", "tumbling"])
@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: "S{}-W{}-B{}-tpf{}-pt{}-cfg{}-reg{}".format(*c))
def test_recache_matches_dense_and_later_blocks_read_the_new_kv(case, reset_at_boundary):
    sink, window, block, tpf, page_tokens, cfg, registers = case
    spec = make_spec(num_layers=2, num_kv_heads=2, head_size=4, tokens_per_frame=tpf,
                     frames_per_block=block, window_frames=window, sink_frames=sink,
                     reset_at_boundary=reset_at_boundary, registers=registers,
                     kv_branches=CFG_BRANCHES if cfg else None)
    lock = Lockstep(spec, page_tokens, seed=sum(case))
    branches = [b.name for b in spec.kv_branches]
    rng = random.Random(len(case))
    for _ in range(3 * window):
        for branch in branches:
            lock.probe("s", [branch], steps=rng.randint(0, 1))
            lock.commit("s", [branch])
            used = lock.paged.pool.num_used
            model = lock.model("s", branch)
            choice = rng.random()
            start, count = longlive_range(lock, "s", branch)
            if choice < 0.4 and any(start <= f < start + count for f in model.visible):
                recache(lock, "s", branch, start, count)  # (tumbling: may keep only the sink)
            elif choice < 0.8 and model.visible:  # a committed range with a kept frame
                frame = rng.choice(model.visible)
                start = rng.randint(0, frame)
                recache(lock, "s", branch, start, rng.randint(frame - start + 1, model.n - start))
            assert lock.paged.pool.num_used == used  # no page changes hands
        # later blocks read what the recaches wrote, through both caches (compared per attend)
        lock.probe("s", branches)


def test_a_recache_past_the_window_rewrites_the_kept_frames_and_protects_the_sink():
    """LongLive's switch at frame 15 (sink 3, window 9, blocks of 3): frames 6..14 re-run,
    6..8 (evicted) are context, 9..14 rewritten, the sink 0..2 read as it was."""
    spec = make_spec(num_layers=2, tokens_per_frame=3, frames_per_block=3, window_frames=9,
                     sink_frames=3)
    lock = Lockstep(spec, page_tokens=2, seed=3)
    for _ in range(5):
        lock.commit("s", ["main"])
    assert lock.model("s", "main").visible == [0, 1, 2, 9, 10, 11, 12, 13, 14]
    assert longlive_range(lock, "s", "main") == (6, 9)
    recache(lock, "s", "main", 6, 9)
    lock.commit("s", ["main"])  # the next block agrees on both caches


@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_failed_recache_changes_nothing_and_leaks_no_page(after):
    spec = make_spec(num_layers=2, tokens_per_frame=3, frames_per_block=2, window_frames=4,
                     sink_frames=1, registers=2)
    lock = Lockstep(spec, page_tokens=2, seed=after)
    for _ in range(3):
        lock.commit("s", ["main"])
    used = lock.paged.pool.num_used
    with pytest.raises(InjectedFailure):
        recache(lock, "s", "main", 2, 4, fail_after=after)  # checks nothing changed
    assert lock.paged.pool.num_used == used
    lock.commit("s", ["main"])  # later blocks still agree


@pytest.fixture
def state():
    spec = make_spec(num_layers=2, tokens_per_frame=3, frames_per_block=2, window_frames=4,
                     sink_frames=1, kv_branches=CFG_BRANCHES)
    lock = Lockstep(spec, page_tokens=2)
    for _ in range(3):
        lock.commit("s", ["positive"])  # 6 frames; kept 0, 4, 5
    st = open_state(lock.paged, "s")
    yield st
    st.close()


@pytest.mark.parametrize("start, num_frames, message", [
    (5, 2, r"recache on branch 'positive': frames 5..6 are not all committed \(committed: "
           r"0..5\); a recache re-runs frames the branch has made"),
    (-1, 2, r"frames -1..0 are not all committed"),
    (1, 3, r"recache on branch 'positive': none of frames 1..3 is kept \(kept: 0, 4..5\); a "
           r"recache rewrites kept frames: include one of state.kept_frames\('positive'\)"),
    (2, 1, r"none of frames 2 is kept"),
    ("0", 1, r"recache: start_frame='0' is not a frame index; pass an int from "
             r"state.kept_frames\('positive'\)"),
    (4, 0, r"recache: num_frames=0 is not a frame count; pass an int >= 1"),
    (4, True, r"recache: num_frames=True is not a frame count"),
])
def test_recache_of_frames_not_committed_or_none_kept_is_refused(state, start, num_frames,
                                                                 message):
    with pytest.raises(KVStateError, match=message):
        with state.recache("positive", start, num_frames):
            pass


def test_recache_of_an_empty_branch_is_refused(state):
    with pytest.raises(KVStateError, match=r"frames 0..1 are not all committed \(committed: "
                                           r"none\)"):
        with state.recache("negative", 0):
            pass


def test_recache_follows_the_block_rules(state):
    k = torch.zeros(6, 2, 8)
    with state.recache("positive", 4) as blk:
        assert (blk.start_frame, blk.visible_frames) == (4, [0])
        with pytest.raises(KVStateError, match=r"block on local slot 0 .* is still open"):
            with state.block("positive"):
                pass
        blk.attend(0, k, k, k)
        with pytest.raises(KVStateError, match=r"attend: layer 0 attended twice in one recache "
                                               r"block of branch 'positive'"):
            blk.attend(0, k, k, k)
        blk.attend(1, k, k, k)
    with pytest.raises(KVStateError, match=r"used after its `with` ended"):
        blk.attend(0, k, k, k)
    with pytest.raises(KVStateError, match=r"recache block of branch 'positive' ended without "
                                           r"attending layers \[1\]; a recache must attend "
                                           r"every layer once"):
        with state.recache("positive", 4) as blk:
            blk.attend(0, k, k, k)
    k6 = torch.zeros(18, 2, 8)  # frames 0..5 in one forward: more than frames_per_block
    with state.recache("positive", 0, 6) as blk:
        assert blk.visible_frames == []
        with pytest.raises(KVStateError, match=r"k has shape \(6, 2, 8\); expected "
                                               r"\[num_frames \* tokens_per_frame"):
            blk.attend(0, k6, k, k)
        blk.attend(0, k6, k6, k6)
        blk.attend(1, k6, k6, k6)
    assert state.num_committed_frames("positive") == 6
    assert state.kept_frames("positive") == [0, 4, 5]

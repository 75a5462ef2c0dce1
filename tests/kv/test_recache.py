"""`state.recache`: kept frames re-committed at their own positions, paged (poisoned) = dense."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from kvdrive import CFG_BRANCHES, InjectedFailure, Lockstep, check_pool, make_spec

from ardiff.errors import KVStateError
from ardiff.kv.state import open_state


def stored_kv(cache, session_id: str, branch: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V a branch holds for `layer`, [kept tokens, heads, head_size], kept frames in order."""
    kv = cache._sessions[session_id].branches[branch]
    if cache.backend_name == "dense":
        return kv.k[layer], kv.v[layer]
    storage = cache.storage
    return storage.read(layer, storage.frames_address(kv.table.visible_pages))


def recache(lock: Lockstep, session_id: str, branch: str, start: int, num_frames: int,
            fail_after: int | None = None) -> None:
    """One recache on both caches; every attend compared, visibility checked by docs/design.md#3-what-a-block-sees."""
    states = [open_state(cache, session_id) for cache in lock.caches]
    model = lock.model(session_id, branch)
    try:
        with contextlib.ExitStack() as stack:
            pair = [stack.enter_context(st.recache(branch, start, num_frames)) for st in states]
            for blk in pair:
                assert blk.start_frame == start
                assert blk.visible_frames == [f for f in model.visible if f < start]
            for attends, layer in enumerate(lock.rng.sample(range(lock.spec.num_layers),
                                                            lock.spec.num_layers)):
                if attends == fail_after:
                    raise InjectedFailure
                lock._attend(pair, layer, num_frames)
            if fail_after is not None:
                raise InjectedFailure
    finally:
        for state in states:
            state.close()
    check_pool(lock.paged)


def recache_all(lock: Lockstep, session_id: str, branch: str) -> None:
    """Every kept frame, chronologically, in runs of at most frames_per_block."""
    kept, block = lock.model(session_id, branch).visible, lock.spec.frames_per_block
    runs: list[list[int]] = []
    for frame in kept:
        if runs and runs[-1][-1] + 1 == frame and len(runs[-1]) < block:
            runs[-1].append(frame)
        else:
            runs.append([frame])
    for run in runs:
        recache(lock, session_id, branch, run[0], len(run))


def check_same_history(lock: Lockstep, session_id: str, branches: list[str]) -> None:
    for branch in branches:
        n = lock.model(session_id, branch).n
        for cache in lock.caches:
            state = open_state(cache, session_id)
            assert state.num_committed_frames(branch) == n
            assert state.kept_frames(branch) == lock.model(session_id, branch).visible
            state.close()
        for layer in range(lock.spec.num_layers):
            paged, dense = (stored_kv(c, session_id, branch, layer) for c in lock.caches)
            torch.testing.assert_close(paged, dense, rtol=0, atol=0)


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
            if rng.random() < 0.5:
                recache_all(lock, "s", branch)
            elif lock.model("s", branch).visible:  # one partial run somewhere in the kept frames
                frame = rng.choice(lock.model("s", branch).visible)
                recache(lock, "s", branch, frame, 1)
            assert lock.paged.pool.num_used == used  # swapped, not added
        check_same_history(lock, "s", branches)
    lock.release("s")
    assert lock.paged.pool.num_used == 0


def test_recache_replaces_the_frames_and_nothing_else():
    spec = make_spec(num_layers=2, tokens_per_frame=3, frames_per_block=2, window_frames=6,
                     sink_frames=2)
    lock = Lockstep(spec, page_tokens=2, seed=3)
    for _ in range(5):
        lock.commit("s", ["main"])  # 10 frames, kept 0, 1, 6..9
    before = {c.backend_name: [stored_kv(c, "s", "main", layer) for layer in range(2)]
              for c in lock.caches}
    recache(lock, "s", "main", 6, 2)
    tpf = spec.tokens_per_frame
    changed = slice(2 * tpf, 4 * tpf)  # frames 6, 7: the 3rd and 4th kept frames
    for cache in lock.caches:
        for layer in range(2):
            old, new = before[cache.backend_name][layer], stored_kv(cache, "s", "main", layer)
            for o, n in zip(old, new):
                assert not torch.equal(o[changed], n[changed])
                torch.testing.assert_close(o[:changed.start], n[:changed.start], rtol=0, atol=0)
                torch.testing.assert_close(o[changed.stop:], n[changed.stop:], rtol=0, atol=0)
    check_same_history(lock, "s", ["main"])


@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_failed_recache_changes_nothing_and_leaks_no_page(after):
    spec = make_spec(num_layers=2, tokens_per_frame=3, frames_per_block=2, window_frames=4,
                     sink_frames=1, registers=2)
    lock = Lockstep(spec, page_tokens=2, seed=after)
    for _ in range(3):
        lock.commit("s", ["main"])
    before = [stored_kv(lock.paged, "s", "main", layer) for layer in range(2)]
    used = lock.paged.pool.num_used
    with pytest.raises(InjectedFailure):
        recache(lock, "s", "main", 4, 2, fail_after=after)
    assert lock.paged.pool.num_used == used
    for layer, (k, v) in enumerate(before):
        torch.testing.assert_close(stored_kv(lock.paged, "s", "main", layer), (k, v),
                                   rtol=0, atol=0)
    check_same_history(lock, "s", ["main"])
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
    (2, 2, r"recache on branch 'positive': frames 2..3 are not all kept \(frames 2..3 are not; "
           r"kept: 0, 4..5\); a recache re-commits frames the branch still holds: pick them "
           r"from state.kept_frames\('positive'\)"),
    (5, 2, r"frames 5..6 are not all kept \(frames 6 are not; kept: 0, 4..5\)"),
    (0, 2, r"frames 0..1 are not all kept \(frames 1 are not; kept: 0, 4..5\)"),
    (-1, 1, r"frames -1 are not all kept"),
    ("0", 1, r"recache: start_frame='0' is not a frame index; pass an int from "
             r"state.kept_frames\('positive'\)"),
    (4, 3, r"recache: num_frames=3 is out of range 1..frames_per_block=2"),
])
def test_recache_of_frames_not_kept_is_refused(state, start, num_frames, message):
    with pytest.raises(KVStateError, match=message):
        with state.recache("positive", start, num_frames):
            pass


def test_recache_of_an_empty_branch_is_refused(state):
    with pytest.raises(KVStateError, match=r"frames 0..1 are not all kept .*kept: none"):
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
    assert state.num_committed_frames("positive") == 6
    assert state.kept_frames("positive") == [0, 4, 5]

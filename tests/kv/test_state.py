"""Misuse of the KV state API (docs/design.md#2-the-contract): typed errors that say what was expected and what came."""

from __future__ import annotations

import pytest
import torch
from kvdrive import SHARED_SLOT_BRANCHES, make_spec, plan_for

from ardiff.errors import KVStateError, SessionError
from ardiff.kv.backend import create_cache
from ardiff.kv.backends import backend_names
from ardiff.kv.state import open_state

BACKENDS = list(backend_names())  # every backend of ardiff.kv.backends
L, H, HS, TPF, B = 2, 2, 4, 3, 2  # layers, kv heads, head size, tokens per frame, frames per block


def spec_(**kw):
    base = dict(num_layers=L, num_kv_heads=H, head_size=HS, tokens_per_frame=TPF,
                frames_per_block=B, window_frames=4, sink_frames=1, registers=3,
                cross={"text": 5})
    return make_spec(**{**base, **kw})


def cache_(backend, spec=None, **plan_kw):
    return create_cache(plan_for(spec or spec_(), **plan_kw), backend, poison=True)


def qkv(num_frames=B, q_heads=2 * H, dtype=torch.float32, device="cpu"):
    tokens = num_frames * TPF
    make = lambda heads: torch.randn(tokens, heads, HS).to(device, dtype)  # noqa: E731
    return make(q_heads), make(H), make(H)


def commit_block(state, branch="main"):
    with state.block(branch, commit=True) as blk:
        for layer in range(L):
            blk.attend(layer, *qkv())


def used_pages(cache):
    return cache.pool.num_used if cache.backend_name == "paged" else None


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


# -- the commit block's layer rules ----------------------------------------------------

def test_same_layer_twice_in_a_commit_block(backend):
    cache = cache_(backend)
    state = open_state(cache, "s")
    with pytest.raises(KVStateError, match=r"layer 1 attended twice in one commit block of "
                                           r"branch 'main'; a commit calls attend once per layer"):
        with state.block("main", commit=True) as blk:
            blk.attend(1, *qkv())
            blk.attend(1, *qkv())
    assert state.num_committed_frames("main") == 0
    assert used_pages(cache) in (0, None)


def test_probe_may_attend_a_layer_once_per_step(backend):
    state = open_state(cache_(backend), "s")
    with state.block("main") as blk:
        for _step in range(3):
            for layer in range(L):
                blk.attend(layer, *qkv())
    assert state.num_committed_frames("main") == 0


def test_commit_block_missing_a_layer_commits_nothing(backend):
    cache = cache_(backend)
    state = open_state(cache, "s")
    commit_block(state)
    used = used_pages(cache)
    with pytest.raises(KVStateError, match=r"commit block of branch 'main' ended without "
                                           r"attending layers \[1\]; a commit must attend every"):
        with state.block("main", commit=True) as blk:
            blk.attend(0, *qkv())
    assert state.num_committed_frames("main") == B
    assert used_pages(cache) == used
    with state.block("main", commit=True) as blk:  # the next block starts where the last commit ended
        assert blk.start_frame == B
        assert blk.visible_frames == [0, 1]
        for layer in range(L):
            blk.attend(layer, *qkv())


@pytest.mark.parametrize("layer", [2, True])
def test_layer_out_of_range(backend, layer):
    state = open_state(cache_(backend), "s")
    with pytest.raises(KVStateError, match=rf"layer {layer!r} is out of range 0\.\.1"):
        with state.block("main") as blk:
            blk.attend(layer, *qkv())


# -- tensors: shapes, dtypes, devices ---------------------------------------------------

@pytest.mark.parametrize("which, shape, said", [
    ("q", (B * TPF, 2 * H, HS + 1), r"q has shape \(6, 4, 5\); expected \[q_tokens > 0, q_heads "
                                    r"\(a multiple of num_kv_heads=2\), head_size=4\]"),
    ("q", (B * TPF, 3, HS), r"q has shape \(6, 3, 4\); expected .*a multiple of num_kv_heads=2"),
    ("q", (B * TPF, 2 * H), r"q has shape \(6, 4\); expected \[q_tokens > 0"),
    ("k", (B * TPF - 1, H, HS), r"k has shape \(5, 2, 4\); expected \[num_frames \* "
                                r"tokens_per_frame, num_kv_heads, head_size\] = \(6, 2, 4\)"),
    ("v", (B * TPF, H + 1, HS), r"v has shape \(6, 3, 4\); expected .* = \(6, 2, 4\)"),
    ("k", (B * TPF, H, HS + 1), r"k has shape \(6, 2, 5\); expected .* = \(6, 2, 4\)"),
])
def test_wrong_shape_names_the_tensor(backend, which, shape, said):
    cache = cache_(backend)
    state = open_state(cache, "s")
    args = dict(zip("qkv", qkv()))
    args[which] = torch.randn(*shape)
    with pytest.raises(KVStateError, match=r"attend\(layer=0\): " + said):
        with state.block("main", commit=True) as blk:
            blk.attend(0, **args)
    assert state.num_committed_frames("main") == 0
    assert used_pages(cache) in (0, None)


def test_k_must_match_num_frames_of_the_block(backend):
    state = open_state(cache_(backend), "s")
    with state.block("main", num_frames=1) as blk:
        blk.attend(0, *qkv(num_frames=1))
        with pytest.raises(KVStateError, match=r"k has shape \(6, 2, 4\); expected .*\(3, 2, 4\)"):
            blk.attend(1, *qkv(num_frames=2))


@pytest.mark.parametrize("which", ["q", "k", "v", "extra_k", "extra_v"])
def test_wrong_dtype_names_the_tensor(backend, which):
    state = open_state(cache_(backend), "s")
    args = dict(zip("qkv", qkv()), extra_k=torch.randn(2, H, HS), extra_v=torch.randn(2, H, HS))
    args[which] = args[which].double()
    with pytest.raises(KVStateError, match=rf"attend\(layer=0\): {which} is torch.float64; "
                                           rf"expected torch.float32 \(the runtime dtype\)"):
        with state.block("main") as blk:
            blk.attend(0, **args)


@pytest.mark.parametrize("which", ["q", "k", "v", "extra_k"])
def test_wrong_device_names_the_tensor(backend, which):
    state = open_state(cache_(backend), "s")
    args = dict(zip("qkv", qkv()), extra_k=torch.randn(2, H, HS), extra_v=torch.randn(2, H, HS))
    args[which] = args[which].to("meta")  # a device other than the cache's, on any machine
    with pytest.raises(KVStateError, match=rf"{which} is on meta; expected cpu"):
        with state.block("main") as blk:
            blk.attend(0, **args)


def test_not_a_tensor(backend):
    state = open_state(cache_(backend), "s")
    q, k, v = qkv()
    with pytest.raises(KVStateError, match=r"k is a list, expected a torch.Tensor"):
        with state.block("main") as blk:
            blk.attend(0, q, k.tolist(), v)
    with pytest.raises(KVStateError, match=r"extra_k is a list, expected a torch.Tensor"):
        with state.block("main") as blk:
            blk.attend(0, q, k, v, extra_k=[[0.0]], extra_v=torch.randn(1, H, HS))


# -- register tokens -------------------------------------------------------------------------

def test_extra_tokens_above_max_scratch(backend):
    state = open_state(cache_(backend), "s")
    extra = torch.randn(4, H, HS)
    with pytest.raises(KVStateError, match=r"attend\(layer=0\): 4 register tokens passed; the "
                                           r"spec allows 1\.\.max_scratch_tokens_per_branch=3"):
        with state.block("main") as blk:
            blk.attend(0, *qkv(), extra_k=extra, extra_v=extra)


def test_extra_tokens_when_the_spec_declares_none(backend):
    state = open_state(cache_(backend, spec_(registers=0)), "s")
    extra = torch.randn(1, H, HS)
    with pytest.raises(KVStateError, match=r"1 register tokens passed; the spec allows "
                                           r"1\.\.max_scratch_tokens_per_branch=0"):
        with state.block("main") as blk:
            blk.attend(0, *qkv(), extra_k=extra, extra_v=extra)


def test_extra_k_without_extra_v_and_mismatched_lengths(backend):
    state = open_state(cache_(backend), "s")
    with state.block("main") as blk:
        with pytest.raises(KVStateError, match=r"pass both extra_k and extra_v or neither"):
            blk.attend(0, *qkv(), extra_k=torch.randn(2, H, HS))
        with pytest.raises(KVStateError, match=r"extra_v has shape \(3, 2, 4\); expected "
                                               r"\[n, num_kv_heads, head_size\] = \(2, 2, 4\)"):
            blk.attend(0, *qkv(), extra_k=torch.randn(2, H, HS), extra_v=torch.randn(3, H, HS))


# -- branches, frames, slots ----------------------------------------------------------------

def test_unknown_branch(backend):
    state = open_state(cache_(backend), "s")
    with pytest.raises(KVStateError, match=r"branch 'positive' is not declared by the spec "
                                           r"\(declared: main\)"):
        with state.block("positive"):
            pass
    with pytest.raises(KVStateError, match=r"branch 'x' is not declared"):
        state.num_committed_frames("x")
    with pytest.raises(KVStateError, match=r"branch 'x' is not declared"):
        state.cross_kv("x", "text")


def test_two_branches_sharing_a_local_index_in_one_session(backend):
    cache = cache_(backend, spec_(kv_branches=SHARED_SLOT_BRANCHES, session_capacity=2),
                   max_sessions=2)
    state = open_state(cache, "s")
    commit_block(state, "positive")
    with pytest.raises(KVStateError, match=r"branches 'positive' and 'negative' share "
                                           r"local_index 0; one session can use only one"):
        with state.block("negative"):
            pass
    with pytest.raises(KVStateError, match=r"share local_index 0"):
        state.set_cross_kv("negative", "text", [(torch.randn(5, H, HS),) * 2] * L)
    assert state.num_committed_frames("positive") == B
    other = open_state(cache, "t")  # another session may use the other branch
    commit_block(other, "negative")
    assert other.num_committed_frames("negative") == B


@pytest.mark.parametrize("num_frames", [0, B + 1, -1, 1.0, True])
def test_num_frames_out_of_range(backend, num_frames):
    state = open_state(cache_(backend), "s")
    with pytest.raises(KVStateError, match=rf"block: num_frames={num_frames!r} is out of range "
                                           rf"1\.\.frames_per_block={B}"):
        with state.block("main", num_frames=num_frames):
            pass


def test_second_block_on_the_same_slot(backend):
    cache = cache_(backend, spec_(session_capacity=2), max_sessions=2)
    state, other = open_state(cache, "s"), open_state(cache, "t")
    with state.block("main") as blk:
        with pytest.raises(KVStateError, match=r"block on branch 'main': a block on local slot "
                                               r"0 \('main'\) is still open; close it first"):
            with state.block("main"):
                pass
        with pytest.raises(KVStateError, match=r"local slot 0 .* is still open"):
            with other.block("main", commit=True):  # in-flight pages are per slot, not session
                pass
        blk.attend(0, *qkv())  # the open block is unharmed
    commit_block(other)  # and the slot is free again
    assert (state.num_committed_frames("main"), other.num_committed_frames("main")) == (0, B)


# -- lifecycle: released sessions, forgotten states, capacity -------------------------------------

def _every_use(state):
    yield lambda: state.num_committed_frames("main")
    yield lambda: state.block("main").__enter__()
    yield lambda: state.cross_kv("main", "text")
    yield lambda: state.set_cross_kv("main", "text", [(torch.randn(5, H, HS),) * 2] * L)
    yield lambda: state.clear_cross_kv("main")


@pytest.mark.parametrize("how", ["release", "forget"])
def test_state_used_after_release_or_forget(backend, how):
    cache = cache_(backend)
    state = open_state(cache, "s")
    commit_block(state)
    cache.release_session("s") if how == "release" else state.close()
    for use in _every_use(state):
        with pytest.raises(KVStateError, match=r"KV state of session 's' used after its bind "
                                               r"ended or the session was released"):
            use()
    if how == "release":
        assert not cache.has_session("s")
        assert used_pages(cache) in (0, None)
        assert open_state(cache, "s").num_committed_frames("main") == 0  # a fresh session


@pytest.mark.parametrize("how", ["release", "forget"])
def test_block_left_open_across_release_or_forget(backend, how):
    """A commit block whose state ends while it is open commits nothing and leaks nothing."""
    cache = cache_(backend)
    state = open_state(cache, "s")
    with pytest.raises(KVStateError, match=r"used after its bind ended or the session was "
                                           r"released"):
        with state.block("main", commit=True) as blk:
            for layer in range(L):
                blk.attend(layer, *qkv())
            cache.release_session("s") if how == "release" else state.close()
    if how == "release":
        assert used_pages(cache) in (0, None)
    assert open_state(cache, "s").num_committed_frames("main") == 0


def test_release_unknown_session(backend):
    cache = cache_(backend)
    with pytest.raises(SessionError, match=r"session 'nope' is not resident; nothing to release"):
        cache.release_session("nope")
    open_state(cache, "s")
    cache.release_session("s")
    with pytest.raises(SessionError, match=r"session 's' is not resident"):
        cache.release_session("s")


def test_more_sessions_than_capacity(backend):
    cache = cache_(backend, spec_(session_capacity=2), max_sessions=2)
    assert cache.capacity == 2
    open_state(cache, "a")
    open_state(cache, "b")
    open_state(cache, "a")  # a resident session opens again freely
    with pytest.raises(SessionError, match=r"KV cache is full \(2 sessions resident\); release "
                                           r"one before opening session 'c'"):
        open_state(cache, "c")
    assert sorted(cache.session_ids) == ["a", "b"]
    cache.release_session("a")
    open_state(cache, "c")


def test_close_is_safe_twice(backend):
    cache = cache_(backend)
    commit_block(open_state(cache, "s"))
    cache.close()
    cache.close()
    assert cache.session_ids == []
    assert used_pages(cache) in (0, None)


def test_unknown_backend():
    with pytest.raises(KVStateError, match=r"runtime.kv.backend: 'sparse' is not a backend; "
                                           r"use paged or dense"):
        create_cache(plan_for(spec_()), "sparse")


# -- a block lives only inside its `with` ----------------------------------------------------
@pytest.mark.parametrize("commit", [False, True])
def test_a_block_is_dead_after_its_with(backend, commit):
    cache = cache_(backend)
    state = open_state(cache, "s")
    commit_block(state)
    with state.block("main", commit=commit) as kept:
        for layer in range(L):
            kept.attend(layer, *qkv())
    pages = used_pages(cache)
    message = r"block on branch 'main' used after its `with` ended; its pages are history or free"
    for use in (lambda: kept.attend(0, *qkv()), lambda: kept.start_frame,
                lambda: kept.visible_frames):
        with pytest.raises(KVStateError, match=message):
            use()
    assert used_pages(cache) == pages  # nothing was read or written through the dead block
    assert state.num_committed_frames("main") == (2 * B if commit else B)


def test_a_block_is_dead_after_its_with_raised(backend):
    state = open_state(cache_(backend), "s")
    with pytest.raises(RuntimeError, match="inside"):
        with state.block("main", commit=True) as kept:
            raise RuntimeError("inside")
    with pytest.raises(KVStateError, match="used after its `with` ended"):
        kept.attend(0, *qkv())
    assert state.num_committed_frames("main") == 0


# -- positions past max_model_len --------------------------------------------------------------
def test_a_block_past_max_model_len_is_refused_at_run_time(backend):
    import dataclasses

    spec = dataclasses.replace(spec_(), max_model_len=5)  # two blocks of 2 fit, the third not
    cache = cache_(backend, spec)
    state = open_state(cache, "s")
    commit_block(state)
    commit_block(state)
    with pytest.raises(KVStateError, match=r"block on branch 'main' at frames 4\.\.5 passes the "
                                           r"spec's max_model_len=5; reset the session"):
        with state.block("main", commit=False):
            pass
    with state.block("main", commit=True, num_frames=1) as blk:  # frame 4 still fits
        for layer in range(L):
            blk.attend(layer, *qkv(num_frames=1))
    assert state.num_committed_frames("main") == 5


def test_a_block_refused_for_its_positions_claims_no_slot(backend):
    import dataclasses

    spec = dataclasses.replace(spec_(kv_branches=SHARED_SLOT_BRANCHES), max_model_len=1)
    state = open_state(cache_(backend, spec), "s")
    with pytest.raises(KVStateError, match="passes the spec's max_model_len=1"):
        with state.block("positive"):
            pass
    assert state._session.slot_owner == {}  # the other branch of the slot is still free


# -- a block entered and never exited ----------------------------------------------------------
def _enter_only(state, kind):
    """Enter a block of `kind` the way a buggy pipeline does: `__enter__`, no `__exit__`
    (the context manager kept alive: a dropped recache's generator would end it)."""
    if kind == "recache":
        scope = state.recache("main", start_frame=B)
    else:
        scope = state.block("main", commit=kind == "commit")
    return scope, scope.__enter__()


@pytest.mark.parametrize("kind", ["probe", "commit", "recache"])
def test_a_block_never_exited_is_given_back_when_its_state_closes(backend, kind):
    cache = cache_(backend)
    state = open_state(cache, "s")
    commit_block(state)
    commit_block(state)
    history = used_pages(cache)
    _scope, blk = _enter_only(state, kind)
    for layer in range(L):
        blk.attend(layer, *qkv())

    assert state.close() == [f"a {kind} block of branch 'main'"]

    assert used_pages(cache) == history  # its in-flight pages are back in the pool
    with pytest.raises(KVStateError, match="used after its bind ended"):
        blk.attend(0, *qkv())
    state = open_state(cache, "s")
    assert state.num_committed_frames("main") == 2 * B  # nothing of it was committed
    commit_block(state)  # and its slot is free again
    assert state.close() == []


def test_a_block_exited_after_its_state_closed_gave_it_back_raises_once(backend):
    cache = cache_(backend)
    state = open_state(cache, "s")
    scope = state.block("main", commit=True)
    scope.__enter__()
    assert state.close() == ["a commit block of branch 'main'"]
    with pytest.raises(KVStateError, match="used after its bind ended"):
        scope.__exit__(None, None, None)
    assert used_pages(cache) in (0, None) and state.close() == []

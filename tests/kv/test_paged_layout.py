"""The paged read path (ardiff/kv/paged.py): block-stable addresses, per-slot register pages
written once per AR block, poisoned pages through a block's whole life, and the attend
checks' fast path. Paged (poison=True) is compared with the dense reference throughout."""

from __future__ import annotations

import pytest
import torch

from ardiff.errors import KVStateError
from ardiff.kv.backend import create_cache
from ardiff.kv.state import Block, open_state
from kvdrive import CFG_BRANCHES, make_spec, plan_for

LAYERS, HEADS, HS, TPF, REGISTERS = 2, 2, 4, 3, 2


def spec_(**kw):
    base = dict(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HS, tokens_per_frame=TPF,
                frames_per_block=1, window_frames=3, sink_frames=1, registers=REGISTERS)
    return make_spec(**{**base, **kw})


def caches(spec, page_tokens=2):
    plan = plan_for(spec, page_tokens, max_sessions=2)
    return create_cache(plan, "paged", poison=True), create_cache(plan, "dense")


def randn(*shape):
    return torch.randn(*shape)


class Frame:
    """One AR block's inputs: the same q/k/v/registers for every probe and the commit (as
    a pipeline's action registers are), per layer."""

    def __init__(self, spec):
        self.qkv = [(randn(TPF, 2 * HEADS, HS), randn(TPF, HEADS, HS), randn(TPF, HEADS, HS))
                    for _ in range(spec.num_layers)]
        self.registers = [(randn(REGISTERS, HEADS, HS), randn(REGISTERS, HEADS, HS))
                          for _ in range(spec.num_layers)]


def run_frame(states, frame, probes=2, branch="main"):
    """`probes` probe blocks and a commit on every state; outputs must agree exactly."""
    for step in range(probes + 1):
        outs = []
        for state in states:
            with state.block(branch, commit=step == probes) as blk:
                outs.append([blk.attend(layer, *frame.qkv[layer], *frame.registers[layer])
                             for layer in range(LAYERS)])
        for got, want in zip(*outs):
            assert not torch.isnan(got).any(), "paged attention read a poisoned page"
            assert torch.equal(got, want)


def count_register_writes(cache, monkeypatch) -> list[int]:
    """Counts storage writes into register pages."""
    register_tokens = {p * cache.plan.page_tokens + t for s in cache.slots
                       for p in s.register_pages for t in range(cache.plan.page_tokens)}
    writes = [0]
    original = cache.storage.write

    def write(layer, address, k, v):
        if set(address.index.tolist()) <= register_tokens:
            writes[0] += 1
        original(layer, address, k, v)

    monkeypatch.setattr(cache.storage, "write", write)
    return writes


def test_registers_are_written_once_per_ar_block(monkeypatch):
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    writes = count_register_writes(paged, monkeypatch)
    for n in range(5):  # new registers each AR block (a new action), reused by its probes
        run_frame(states, Frame(paged.spec), probes=3)
        assert writes[0] == LAYERS * (n + 1), "one write per layer per AR block, not per probe"


def test_registers_changed_in_place_are_caught_in_poison_mode():
    paged, _ = caches(spec_())
    state = open_state(paged, "s")
    frame = Frame(paged.spec)
    with torch.inference_mode():  # inference tensors carry no version counter
        rk, rv = frame.registers[0][0].clone(), frame.registers[0][1].clone()
        with state.block("main") as blk:
            blk.attend(0, *frame.qkv[0], rk, rv)
        rk.add_(1.0)
        with state.block("main") as blk, pytest.raises(KVStateError, match=(
                r"attend\(layer=0\): extra_k/extra_v were changed in place after an earlier "
                r"attend stored them; .* pass new tensors when they change")):
            blk.attend(0, *frame.qkv[0], rk, rv)


def test_registers_changed_in_place_outside_inference_mode_are_rewritten():
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    frame = Frame(paged.spec)
    run_frame(states, frame, probes=1)
    for rk, rv in frame.registers:  # the version counter moves: paged stores them again
        rk.mul_(2.0)
        rv.add_(1.0)
    run_frame(states, frame, probes=1)


def test_a_released_session_leaves_no_registers_behind():
    paged, dense = caches(spec_())
    frame = Frame(paged.spec)
    run_frame([open_state(c, "a") for c in (paged, dense)], frame)
    for cache in (paged, dense):
        cache.release_session("a")
    ids = torch.tensor(paged.slots[0].register_pages)
    assert all(torch.isnan(t[ids]).all() for t in (*paged.storage.k, *paged.storage.v))
    assert paged.slots[0].held == [None] * LAYERS
    run_frame([open_state(c, "b") for c in (paged, dense)], frame)  # same tensors: stored again


def test_probes_of_a_block_reuse_one_address_and_the_same_pages():
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    run_frame(states, Frame(paged.spec))
    seen = []
    for _ in range(3):
        with states[0].block("main") as blk:
            seen.append((blk._kv.frames, blk._kv.address))
    assert seen[0][0] == seen[1][0] == seen[2][0], "an aborted block's pages come back in order"
    assert seen[0][1] is seen[1][1] is seen[2][1], "one address per table version"
    run_frame(states, Frame(paged.spec))
    with states[0].block("main") as blk:
        assert blk._kv.address is not seen[0][1], "a commit changes what a block reads"


@pytest.mark.parametrize("fail_at", [0, 1, LAYERS])
def test_in_flight_pages_are_poisoned_again_after_every_block(fail_at):
    """Probe, failed commit and commit: in-flight pages hold data only while their block is
    open; afterwards they are NaN (free) or history."""
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    frame = Frame(paged.spec)
    for _ in range(4):
        run_frame(states, frame)

    def free_pages_are_nan():
        used = {p for b in paged._sessions["s"].branches.values()
                for pages in b.table.visible_pages for p in pages}
        free = torch.tensor(sorted(set(range(paged.pool.num_pages)) - used))
        return all(torch.isnan(t[free]).all() for t in (*paged.storage.k, *paged.storage.v))

    assert free_pages_are_nan()
    with pytest.raises(RuntimeError, match="injected"):
        with states[0].block("main", commit=True) as blk:
            for layer in range(fail_at):
                blk.attend(layer, *frame.qkv[layer], *frame.registers[layer])
            raise RuntimeError("injected")
    assert free_pages_are_nan() and paged.pool.num_used == paged.plan.history_pages_per_session
    run_frame(states, Frame(paged.spec))  # history intact: still equal to dense
    assert free_pages_are_nan()


def test_cfg_branches_each_keep_their_own_registers(monkeypatch):
    spec = spec_(kv_branches=CFG_BRANCHES)
    paged, dense = caches(spec)
    states = [open_state(c, "s") for c in (paged, dense)]
    writes = count_register_writes(paged, monkeypatch)
    positive, negative = Frame(spec), Frame(spec)
    for _ in range(2):
        run_frame(states, positive, branch="positive")
        run_frame(states, negative, branch="negative")
    assert writes[0] == 2 * LAYERS, "each slot stored its registers once"


def test_the_fast_check_path_takes_good_arguments_without_the_full_checks(monkeypatch):
    paged, _ = caches(spec_())
    state = open_state(paged, "s")
    frame = Frame(paged.spec)

    def full_checks(*args, **kwargs):
        raise AssertionError("good arguments went through the full checks")

    monkeypatch.setattr(Block, "_check_all", full_checks)
    with state.block("main") as blk:
        blk.attend(0, *frame.qkv[0], *frame.registers[0])
        blk.attend(1, *frame.qkv[1])


@pytest.mark.parametrize("bad", ["layer", "k_shape", "q_dtype", "extra_count", "list", "twice"])
def test_the_fast_check_path_sends_bad_arguments_to_the_full_checks(bad):
    paged, _ = caches(spec_())
    state = open_state(paged, "s")
    q, k, v = Frame(paged.spec).qkv[0]
    rk = randn(REGISTERS + 1, HEADS, HS)
    args = {"layer": (LAYERS, q, k, v), "k_shape": (0, q, k[:1], v),
            "q_dtype": (0, q.double(), k, v), "extra_count": (0, q, k, v, rk, rk),
            "list": (0, q.tolist(), k, v), "twice": (0, q, k, v)}[bad]
    with pytest.raises(KVStateError), state.block("main", commit=True) as blk:
        if bad == "twice":
            blk.attend(*args)
        blk.attend(*args)


def test_window_full_blocks_read_static_index_buffers():
    """What `ardiff::paged_attend` reads: views of per-slot buffers, rewritten in place, with
    one address and one shape once the window is full (what a CUDA graph needs)."""
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    views = []
    for _ in range(6):
        run_frame(states, Frame(paged.spec), probes=1)
        with states[0].block("main") as blk:
            kv = blk._kv
            write, read = kv.op_indices[REGISTERS]
            assert torch.equal(read, kv.address.read(REGISTERS).index)
            assert torch.equal(write, torch.cat([kv.address.block.index,
                                                 kv.address.registers(REGISTERS).index]))
            views.append((write.data_ptr(), read.data_ptr(), read.shape))
    full = views[2:]  # sink 1 + 2 past frames: full from the third commit on
    assert len(set(full)) == 1, "same buffers, same shapes block after block"

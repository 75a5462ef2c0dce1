"""The paged read path (ardiff/kv/paged.py): block-stable addresses, what probes and commits
write, poisoned pages through a block's whole life, static index buffers, and the attend
checks' fast path. Paged (poison=True) is compared with the dense reference throughout."""

from __future__ import annotations

import pytest
import torch
from kvdrive import make_spec, plan_for

from ardiff.errors import KVStateError
from ardiff.kv.backend import create_cache
from ardiff.kv.state import Block, open_state

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


def _is_nan(cache, page_ids) -> bool:
    ids = torch.tensor(sorted(page_ids), dtype=torch.long)
    return all(torch.isnan(t[ids]).all() for t in (*cache.storage.k, *cache.storage.v))


def test_probes_write_no_pages_and_a_commit_writes_only_its_own():
    """A probe attends to its k/v directly (docs/design.md#4-memory): its in-flight pages stay NaN. A
    commit's attend stores that layer's k/v in them. Registers are never stored."""
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    run_frame(states, Frame(paged.spec))
    frame = Frame(paged.spec)
    registers = paged.slots[0].register_pages
    with states[0].block("main") as blk:
        for layer in range(LAYERS):
            blk.attend(layer, *frame.qkv[layer], *frame.registers[layer])
        pages = [p for pages in blk._kv.frames for p in pages]
        assert _is_nan(paged, pages) and _is_nan(paged, registers)
    with states[0].block("main", commit=True) as blk:
        blk.attend(0, *frame.qkv[0], *frame.registers[0])
        pages = [p for pages in blk._kv.frames for p in pages]
        ids = torch.tensor(pages)
        stored = paged.storage.k[0][ids].flatten(0, 1)[:TPF]
        assert torch.equal(stored, frame.qkv[0][1]), "layer 0's k is in the in-flight pages"
        assert torch.isnan(paged.storage.k[1][ids]).all(), "layer 1 not attended yet"
        blk.attend(1, *frame.qkv[1], *frame.registers[1])
    assert _is_nan(paged, registers)


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "inference"])
def test_registers_changed_in_place_between_probes_are_seen(inference):
    """Nothing caches registers: a tensor changed in place (even an inference tensor, which
    has no version counter) gives what dense gives."""
    paged, dense = caches(spec_())
    states = [open_state(c, "s") for c in (paged, dense)]
    frame = Frame(paged.spec)
    with torch.inference_mode(inference):
        frame.registers = [(rk.clone(), rv.clone()) for rk, rv in frame.registers]
        run_frame(states, frame, probes=0)
        for rk, rv in frame.registers:
            rk.mul_(2.0)
            rv.add_(1.0)
        run_frame(states, frame, probes=1)


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


def test_an_eager_cache_loads_no_op_indices_and_its_traced_attend_says_so():
    """A cache planned for the eager path (stores_registers=False: no runtime.compile) skips
    the per-block load of the op's index buffers; an op call through it raises, naming the fix."""
    import dataclasses

    spec = spec_()
    plan = dataclasses.replace(plan_for(spec, 2, max_sessions=2), stores_registers=False)
    state = open_state(create_cache(plan, "paged", poison=True), "s")
    q, k, v = Frame(spec).qkv[0]
    with state.block("main") as blk:
        assert blk._kv.op_indices is None
        with pytest.raises(KVStateError, match="runtime.compile: true"):
            blk._kv.traced_attend(0, q, k, v, None, None, None)


@pytest.mark.parametrize("max_runs", [0, 1])
def test_a_scattered_history_is_gathered_and_still_equals_dense(max_runs, monkeypatch):
    """Past MAX_VIEW_RUNS stretches the history is read by one gather instead of views."""
    from kvdrive import CFG_BRANCHES, Lockstep, drive_random

    from ardiff.kv import storage as storage_module

    monkeypatch.setattr(storage_module, "MAX_VIEW_RUNS", max_runs)
    spec = make_spec(num_layers=2, num_kv_heads=2, head_size=4, tokens_per_frame=5,
                     frames_per_block=2, window_frames=5, sink_frames=1, registers=2,
                     kv_branches=CFG_BRANCHES)
    lock = Lockstep(spec, page_tokens=2, seed=4)
    drive_random(lock, ["s"], min_frames=16, seed=2, cfg_nested=True, partial_blocks=True)
    assert lock.num_attends > 0

"""`ardiff::paged_attend` (ardiff/kv/ops.py) and `runtime.compile`: a compiled layer stack
attends through the custom op and gives what eager gives, on CPU (inductor builds with gcc)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kvdrive import make_spec, plan_for

from ardiff.config.run import load_config, with_base_dir
from ardiff.contract.forward import RolloutRequest
from ardiff.engine.build import build_runner
from ardiff.errors import ConfigError
from ardiff.kv.backend import create_cache
from ardiff.kv.ops import paged_attend
from ardiff.kv.state import open_state

LAYERS, HEADS, HS, TPF = 2, 2, 8, 4


def test_the_op_stores_the_block_and_reads_its_index():
    k_cache, v_cache = torch.zeros(10, HEADS, HS), torch.zeros(10, HEADS, HS)
    history = torch.randn(3, HEADS, HS)
    k_cache[[7, 1, 4]] = history
    v_cache[[7, 1, 4]] = history
    q, k = torch.randn(2, 2 * HEADS, HS), torch.randn(2, HEADS, HS)
    out = paged_attend(q, k, k, k_cache, v_cache, torch.tensor([2, 3]),
                       torch.tensor([7, 1, 4, 2, 3]), 0.5)
    keys = torch.cat([history, k])
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), keys.transpose(0, 1), scale=0.5,
        enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert torch.equal(k_cache[2:4], k) and torch.equal(v_cache[2:4], k)


def _layer_stack(weights):
    """A two-layer stack attending through `blk`, with work around attention to fuse."""

    def layers(h, blk, registers):
        for layer, w in enumerate(weights):
            x = torch.tanh(h @ w)                                   # [tokens, HEADS * HS]
            q = x.unflatten(-1, (HEADS, HS)).repeat(1, 2, 1)        # [tokens, 2 * HEADS, HS]
            kv = x.unflatten(-1, (HEADS, HS))
            out = blk.attend(layer, q, kv, kv * 0.5, *registers[layer])
            h = h + out.flatten(-2)[:, :h.shape[1]].sigmoid()
        return h

    return layers


@pytest.mark.parametrize("backend, compiler", [
    ("paged", "aot_eager"), ("dense", "aot_eager"),
    pytest.param("paged", "inductor",
                 marks=[pytest.mark.slow, pytest.mark.heavy]),
])
def test_a_compiled_layer_stack_equals_eager(backend, compiler):
    """`aot_eager` traces and functionalizes the op; inductor also generates and builds C++
    around it, far slower with a cold cache, so that case is marked heavy: it runs in
    .ci/run's heavy step (`pytest -q -m heavy`), not in `pytest -q`."""
    torch._dynamo.reset()
    spec = make_spec(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HS, tokens_per_frame=TPF,
                     frames_per_block=1, window_frames=3, sink_frames=1, registers=2)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(HEADS * HS, HEADS * HS, generator=gen) * 0.3 for _ in range(LAYERS)]
    layers = _layer_stack(weights)
    compiled = torch.compile(layers, backend=compiler)
    poison = backend == "paged"
    caches = [create_cache(plan_for(spec), backend, poison=poison) for _ in range(2)]
    states = [open_state(cache, "s") for cache in caches]
    for frame in range(4):  # fills the window: the history the compiled code reads grows
        h = torch.randn(TPF, HEADS * HS, generator=gen)
        registers = [(torch.randn(2, HEADS, HS, generator=gen),) * 2 for _ in range(LAYERS)]
        for step in range(3):  # two probes, then the commit
            outs = []
            for fn, state in zip((layers, compiled), states):
                with state.block("main", commit=step == 2) as blk:
                    outs.append(fn(h, blk, registers))
            assert not torch.isnan(outs[1]).any(), "the compiled stack read a poisoned page"
            torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert [s.num_committed_frames("main") for s in states] == [4, 4]


def test_the_op_stores_registers_in_the_slot_pages_until_the_session_goes():
    torch._dynamo.reset()
    spec = make_spec(num_layers=1, num_kv_heads=HEADS, head_size=HS, tokens_per_frame=TPF,
                     frames_per_block=1, window_frames=2, registers=2)
    cache = create_cache(plan_for(spec, page_tokens=TPF), "paged", poison=True)
    state = open_state(cache, "s")
    q, k, rk = (torch.randn(n, HEADS, HS) for n in (TPF, TPF, 2))
    attend = torch.compile(lambda blk: blk.attend(0, q, k, k, rk, rk), backend="aot_eager")
    with state.block("main", commit=True) as blk:
        attend(blk)
    pages = torch.tensor(cache.slots[0].register_pages)
    assert torch.equal(cache.storage.k[0][pages].flatten(0, 1)[:2], rk)
    cache.release_session("s")
    assert torch.isnan(cache.storage.k[0][pages]).all(), "released: poisoned again"


def test_a_compiled_commit_still_must_attend_every_layer():
    torch._dynamo.reset()
    spec = make_spec(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HS, tokens_per_frame=TPF,
                     frames_per_block=1, window_frames=3)
    state = open_state(create_cache(plan_for(spec), "paged"), "s")

    @torch.compile(backend="aot_eager")
    def one_layer(q, k, blk):
        return blk.attend(0, q, k, k)

    q, k = torch.randn(TPF, HEADS, HS), torch.randn(TPF, HEADS, HS)
    with pytest.raises(Exception, match=r"commit block of branch 'main' ended without "
                                        r"attending layers \[1\]"):
        with state.block("main", commit=True) as blk:
            one_layer(q, k, blk)
    assert state.num_committed_frames("main") == 0


def _tiny_config(**runtime):
    config = load_config(None, ["pipeline.entry=ardiff.pipelines.tiny_dit:TinyCausalDiT",
                                "pipeline.args={num_layers: 1, latent_size: 8, dim: 32, "
                                "num_heads: 2, num_kv_heads: 1, num_steps: 2}",
                                "runtime.max_sessions=1", "runtime.memory_budget=16MiB"])
    return with_base_dir(dataclasses.replace(config, runtime=dataclasses.replace(
        config.runtime, **runtime)), config.base_dir)


@pytest.mark.slow
@pytest.mark.heavy  # inductor: seconds of C++ builds with a cold cache
def test_runtime_compile_gives_the_eager_video():
    torch._dynamo.reset()
    frames = {}
    for compile_ in (False, True):
        runner = build_runner(_tiny_config(compile=compile_))
        frames[compile_] = torch.cat([
            runner.execute(RolloutRequest("s", block_index=i, prompt="p", seed=1)).output.frames
            for i in range(4)]).int()
    assert (frames[True] - frames[False]).abs().max() <= 1  # inductor may round differently


def test_runtime_compile_needs_a_pipeline_hook():
    config = load_config(None, ["pipeline.entry=ardiff.pipelines.synthetic:SyntheticAttention",
                                "pipeline.args={}", "runtime.compile=true", "runtime.memory_budget=16MiB"])
    with pytest.raises(ConfigError, match=r"^runtime.compile: true needs a pipeline with a "
                                          r"compile_layers\(compiler\) method, and "
                                          r"ardiff.pipelines.synthetic:SyntheticAttention has "
                                          r"none; set runtime.compile: false$"):
        build_runner(config)

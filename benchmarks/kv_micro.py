"""Micro-benchmark (not a test): per-block cost of the paged KV cache against the dense one.

    python benchmarks/kv_micro.py [--blocks 4] [--repeats 3] [--wide-steps 1]

One block = `steps` probes + one commit, each attending every layer with
random q/k/v once the window is full. Both backends run the same sequence,
alternating per repeat, and the script prints medians and their ratio for a
tiny geometry and a Wan2.1-1.3B-shaped one (1560 tokens/frame, 12 KV heads x
128, bf16, 2 layers, window 21, 3 frames per block).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ardiff.contract.spec import ARDiffusionKVBranchSpec, ARDiffusionKVCacheSpec
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan
from ardiff.kv.state import open_state

GEOMETRIES = {
    "tiny": (dict(num_layers=2, num_kv_heads=2, head_size=16, tokens_per_frame=16,
                  frames_per_block=3, window_frames=9, sink_frames=1), "float32", 4, 4),
    "wan-1.3b-shaped": (dict(num_layers=2, num_kv_heads=12, head_size=128, tokens_per_frame=1560,
                             frames_per_block=3, window_frames=21), "bfloat16", 2, 1),
}


def run_block(state, spec, q, k, v, steps: int) -> None:
    for step in range(steps + 1):
        with state.block("main", commit=step == steps) as blk:
            for layer in range(spec.num_layers):
                blk.attend(layer, q, k, v)


def measure(spec, dtype: str, dtype_bytes: int, steps: int, blocks: int, repeats: int):
    caches = {b: create_cache(make_plan(spec, dtype, dtype_bytes, 64 << 30, max_sessions=1), b)
              for b in ("paged", "dense")}
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tokens = spec.frames_per_block * spec.tokens_per_frame
    draw = lambda n: torch.randn(n, spec.num_kv_heads, spec.head_size, dtype=torch_dtype)  # noqa
    q, k, v, q_fill = draw(tokens), draw(tokens), draw(tokens), draw(1)
    fill = -(-(spec.sink_frames + spec.window_frames) // spec.frames_per_block)
    times = {b: [] for b in caches}
    for rep in range(repeats):
        for backend, cache in caches.items():
            session = f"{backend}-{rep}"
            for _ in range(fill):  # fill the window with cheap one-token queries
                state = open_state(cache, session)
                run_block(state, spec, q_fill, k, v, 0)
                state.close()
            for _ in range(blocks):
                state = open_state(cache, session)
                start = time.perf_counter()
                run_block(state, spec, q, k, v, steps)
                times[backend].append(time.perf_counter() - start)
                state.close()
            cache.release_session(session)
    return {b: statistics.median(t) for b, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wide-steps", type=int, default=1, help="probes per block (wide)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, (geometry, dtype, dtype_bytes, steps) in GEOMETRIES.items():
        steps = args.wide_steps if name != "tiny" else steps
        spec = ARDiffusionKVCacheSpec(**geometry, kv_branches=(ARDiffusionKVBranchSpec("main", 0),),
                                      session_capacity=1)
        medians = measure(spec, dtype, dtype_bytes, steps, args.blocks, args.repeats)
        print(f"{name:16s} {steps} probes + commit: paged {medians['paged'] * 1e3:9.2f} ms  "
              f"dense {medians['dense'] * 1e3:9.2f} ms  paged/dense "
              f"{medians['paged'] / medians['dense']:.3f}")


if __name__ == "__main__":
    main()

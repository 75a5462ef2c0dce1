"""Paired per-block ratios of two runners over one loaded pipeline: paged / dense, or eager /
compiled. One process, one torch thread; the two arms alternate block by block (which arm
goes first alternates too: ABBA), so machine load and cache state hit both alike. Prints
medians and p10-p90 of the paired ratios, of wall time and of thread CPU time.

    python benchmarks/kv_paired.py default|tiny|wan [--blocks N] [--arms paged,dense]
    python benchmarks/kv_paired.py tiny --arms eager,compiled
    python benchmarks/kv_paired.py default --arms dense,dense2    # A/A: the method's own bias

`wan` is configs/bench-wide.yaml (Wan2.1-1.3B-shaped layers) with 16 query tokens per block,
so K/V movement, not attention arithmetic, dominates: the hardest case for a layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from ardiff.config.run import load_config, with_base_dir
from ardiff.contract.forward import RolloutRequest
from ardiff.engine.build import build_runner, resolve

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"default": None, "tiny": ROOT / "configs/tiny-dit.yaml",
           "wan": ROOT / "configs/bench-wide.yaml"}
WAN_Q_TOKENS = 16


def _config(name: str, compile_: bool = False):
    overrides = ["runtime.max_sessions=1"]
    if name == "wan":
        overrides.append("runtime.dtype=float32")
        overrides.append("runtime.memory_budget=2GiB")
    config = load_config(CONFIGS[name], overrides)
    if compile_:
        runtime = dataclasses.replace(config.runtime, compile=True)
        config = with_base_dir(dataclasses.replace(config, runtime=runtime), config.base_dir)
    return config


def _runners(name: str, arms: list[str]):
    config = _config(name)
    resolved = resolve(config)
    runners = {}
    for i, arm in enumerate(arms):
        backend = arm.rstrip("2") if arm.rstrip("2") in ("paged", "dense") else None
        cfg = _config(name, compile_=arm == "compiled")
        if backend is None:  # eager and compiled: a pipeline each (compiling changes it)
            runners[arm] = build_runner(cfg)
        else:
            runners[arm] = build_runner(cfg, resolve(cfg, resolved.pipeline),
                                        load_weights=i == 0, backend=backend)
    return config, runners


def _request(config, name: str, index: int) -> RolloutRequest:
    r = config.rollout
    prompt = r.prompt if isinstance(r.prompt, str) else "bench"
    extra = {"q_tokens": WAN_Q_TOKENS} if name == "wan" else {}
    actions = (r.actions[index % len(r.actions)],) if r.actions else None
    return RolloutRequest("bench", block_index=index, prompt=prompt, seed=r.seed,
                          actions=actions, extra=extra)


def measure(name: str, blocks: int, arms: list[str]) -> dict:
    config, runners = _runners(name, arms)
    spec = next(iter(runners.values())).plan.spec
    fill = -(-(spec.sink_frames + spec.window_frames) // spec.frames_per_block) + 4
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}  # thread CPU: load-proof
    compile_s = {}
    for arm, runner in runners.items():
        start = time.perf_counter()
        for i in range(fill):  # fill the window (and compile) before timing
            runner.execute(_request(config, name, i))
        compile_s[arm] = time.perf_counter() - start
    for i in range(fill, fill + blocks):
        order = arms if i % 2 == 0 else arms[::-1]
        for arm in order:
            start, start_cpu = time.perf_counter(), time.thread_time()
            runners[arm].execute(_request(config, name, i))
            times[arm].append(time.perf_counter() - start)
            cpu[arm].append(time.thread_time() - start_cpu)
    ratios = sorted(a / b for a, b in zip(times[arms[0]], times[arms[1]]))
    cpu_ratios = sorted(a / b for a, b in zip(cpu[arms[0]], cpu[arms[1]]))
    q, q_cpu = statistics.quantiles(ratios, n=10), statistics.quantiles(cpu_ratios, n=10)
    return {"config": name, "ratio": f"{arms[0]}/{arms[1]}", "blocks": blocks,
            "median": statistics.median(ratios), "p10": q[0], "p90": q[-1],
            "cpu_median": statistics.median(cpu_ratios), "cpu_p10": q_cpu[0],
            "cpu_p90": q_cpu[-1],
            "ms": {arm: 1000 * statistics.median(t) for arm, t in times.items()},
            "fill_s": compile_s}  # the first blocks: compile time for a compiled arm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", choices=sorted(CONFIGS))
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--arms", default="paged,dense")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    result = measure(args.config, args.blocks, args.arms.split(","))
    ms = ", ".join(f"{arm} {v:.2f} ms" for arm, v in result["ms"].items())
    print(f"{result['config']:8s} {result['ratio']}: median {result['median']:.3f} "
          f"(p10 {result['p10']:.3f}, p90 {result['p90']:.3f}); thread CPU median "
          f"{result['cpu_median']:.3f} (p10 {result['cpu_p10']:.3f}, p90 "
          f"{result['cpu_p90']:.3f}) over {result['blocks']} pairs; "
          f"{ms}; first {fill_blocks(result)} s; load {' '.join(load)}")


def fill_blocks(result: dict) -> str:
    return ", ".join(f"{arm} {s:.1f}" for arm, s in result["fill_s"].items())


if __name__ == "__main__":
    main()

"""`run_bench`: every arm over one loaded pipeline, alternating block by block.

    arms:      each KV backend (ardiff.kv.backends), reference (a hand-written loop over
               the same weights, where one ships), compiled (paged with runtime.compile)
    repeat r:  each arm opens a fresh session and fills its window (untimed); then block i
               runs on every arm in turn, the order rotating and reversing per block:
               paged dense ref comp | comp ref dense paged | dense ref comp paged | ...

Block i of every arm runs at nearly the same moment, so paired per-block ratios cancel
most of what a loaded machine does to the times; their medians and p10-p90 are the
result. Torch runs `threads` threads (default 1), so the model thread's CPU time
(`time.thread_time`) is measured too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ardiff.bench import encode as encode_share
from ardiff.bench.arms import Arm, LoopArm, RunnerArm
from ardiff.bench.lengths import check_counts, check_positions
from ardiff.bench.machine import load_average
from ardiff.bench.references import reference_loop
from ardiff.bench.report import RATIOS, BenchReport
from ardiff.config.run import RunConfig, with_base_dir
from ardiff.engine.build import (
    ResolvedPipeline,
    build_runner,
    resolve,
    shutdown_compile_threads,
)
from ardiff.engine.runner import Runner
from ardiff.kv.backends import DEFAULT_BACKEND, backend_names
from ardiff.rollout.inputs import pipeline_actions, read_actions
from ardiff.rollout.report import current_rss_bytes, peak_rss_bytes
from ardiff.sizes import ceil_div

NO_COMPILE = "runtime.compile is not in this build of ardiff"
NO_COMPILE_LAYERS = "the pipeline offers no compile_layers"
COMPILE_ERROR_CHARS = 160  # of a failed compile's message, in the report


def run_bench(config: RunConfig, blocks: int = 8, repeats: int = 3,
              sweep_frames: list[int] | None = None, encode: bool = True,
              compiled: bool = True, threads: int = 1,
              on_progress: Callable[[str], None] | None = None) -> BenchReport:
    """Measure the arms side by side; optionally the encode share and RSS against length.

    Torch runs `threads` intra-op threads meanwhile (restored after). The runners it
    builds are closed on every exit, an exception included. Lengths past their bounds or
    the pipeline's `max_model_len` raise ConfigError before anything is loaded
    (`ardiff.bench.lengths`)."""
    say = on_progress or (lambda message: None)
    check_counts(blocks, repeats, threads, sweep_frames or [])
    eager = _eager(config)
    resolved = resolve(eager)
    check_positions(resolved.spec, resolved.pipeline, config, blocks, sweep_frames or [], encode)
    read_actions(config.rollout.actions, config.base_dir, pipeline_actions(resolved.pipeline),
                 resolved.spec.frames_per_block)  # checked as a rollout checks them
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    runners: dict[str, Runner] = {}
    try:
        report = _measure(resolved, compiled, blocks, repeats, threads, runners, say)
        paged = report.arms[DEFAULT_BACKEND]
        if encode:
            runs = []
            for rep in range(repeats):
                say(f"encode {rep + 1}/{repeats}")
                runs.append(encode_share.measure_encode(paged, blocks, str(rep)))
            report.encode = encode_share.summarize(runs)
        for frames_total in sweep_frames or []:
            say(f"sweep: {frames_total} frames")
            report.sweep.append(_sweep_point(paged, frames_total))
        report.peak_rss_bytes = peak_rss_bytes()
        report.load_after = load_average()
        return report
    finally:
        for runner in runners.values():
            runner.close()
        shutdown_compile_threads()
        torch.set_num_threads(previous_threads)


def _measure(resolved: ResolvedPipeline, compiled: bool, blocks: int, repeats: int,
             threads: int, runners: dict[str, Runner],
             say: Callable[[str], None]) -> BenchReport:
    config = resolved.config
    unavailable: dict[str, str] = {}
    why_not = _build_runners(resolved, compiled, runners)
    if why_not:
        unavailable["compiled"] = why_not
    warmup_s = _warm_up(runners, unavailable, say)
    plan = runners[DEFAULT_BACKEND].plan
    arms: dict[str, Arm] = {name: RunnerArm(name, runners[name], config)
                            for name in backend_names()}
    new_loop, why_not = reference_loop(runners[DEFAULT_BACKEND].pipeline, plan.spec)
    if new_loop is None:
        unavailable["reference"] = why_not
    else:
        arms["reference"] = LoopArm("reference", new_loop, config, plan.spec)
    if "compiled" in runners:
        arms["compiled"] = RunnerArm("compiled", runners["compiled"], config)
    report = BenchReport(blocks, repeats, threads, plan.page_bytes * plan.total_pages, arms,
                         unavailable, warmup_s=warmup_s)
    for rep in range(repeats):
        say(f"repeat {rep + 1}/{repeats}: {', '.join(arms)}, alternating per block")
        _alternate(list(arms.values()), blocks, rep)
        _compare_frames(report)
        for name, runner in runners.items():
            allocated = runner.cache.stats().kv_bytes_allocated
            report.kv_bytes_allocated[name] = max(report.kv_bytes_allocated.get(name, 0),
                                                  allocated)
        for arm in arms.values():
            arm.close()
    return report


def _warm_up(runners: dict[str, Runner], unavailable: dict[str, str],
             say: Callable[[str], None]) -> dict[str, float]:
    """Each runner's warmup seconds. A compiled runner whose warmup (where it compiles)
    fails is closed and dropped, and `unavailable` says why: compiling is the arm on trial."""
    warmup_s = {}
    for name, runner in list(runners.items()):
        compiling = name == "compiled"
        say("compiling the layers (torch.compile; a minute or more on a CPU)..." if compiling
            else f"warmup: {name}")
        try:
            warmup_s[name] = runner.warmup().total_s
            if compiling:
                say(f"compiled in {warmup_s[name]:.1f} s")
        except Exception as exc:
            if name != "compiled":
                raise
            runners.pop(name).close()
            first_line = " ".join(str(exc).split())[:COMPILE_ERROR_CHARS]
            unavailable[name] = f"failed: {type(exc).__name__}: {first_line}"
    return warmup_s


def _eager(config: RunConfig) -> RunConfig:
    """The config of the eager arms: one session, not compiled."""
    return _with_runtime(config, max_sessions=1,
                         **({"compile": False} if _can_compile(config) else {}))


def _can_compile(config: RunConfig) -> bool:
    return "compile" in {f.name for f in dataclasses.fields(config.runtime)}


def _build_runners(resolved: ResolvedPipeline, compiled: bool,
                   runners: dict[str, Runner]) -> str | None:
    """Into `runners`: every KV backend over one loaded pipeline (`resolved`, of `_eager`'s
    config), and `compiled` (paged, with runtime.compile, over a second copy of the
    pipeline: compiling changes the pipeline it is given) when asked and possible; each
    sized for one session. Returns why there is no compiled runner (None when there is
    one). The caller closes them."""
    eager, can_compile = resolved.config, _can_compile(resolved.config)
    for i, backend in enumerate(backend_names()):
        runners[backend] = build_runner(eager, resolved, load_weights=i == 0, backend=backend)
    if not compiled:
        return "not asked for (--no-compile)"
    if not can_compile:
        return NO_COMPILE
    config_c = _with_runtime(eager, compile=True)
    resolved_c = resolve(config_c)
    if not callable(getattr(resolved_c.pipeline, "compile_layers", None)):
        return NO_COMPILE_LAYERS
    runners["compiled"] = build_runner(config_c, resolved_c, backend=DEFAULT_BACKEND)
    return None


def _with_runtime(config: RunConfig, **changes) -> RunConfig:
    runtime = dataclasses.replace(config.runtime, **changes)
    return with_base_dir(dataclasses.replace(config, runtime=runtime), config.base_dir)


def _alternate(arms: list[Arm], blocks: int, rep: int) -> None:
    for arm in arms:
        arm.open(str(rep))
    for i in range(blocks):
        for arm in block_order(arms, rep * blocks + i):
            arm.step()


def block_order(arms: list, step: int) -> list:
    """The arms' order for one step: rotated by `step // 2`, and reversed on odd steps, so
    every arm runs first and last equally often and follows each of the others (a fixed
    cyclic order always ran `paged` right after `compiled`, which measurably slowed it;
    docs/performance.md)."""
    first = (step // 2) % len(arms)
    order = arms[first:] + arms[:first]
    return order[::-1] if step % 2 else order


def _compare_frames(report: BenchReport) -> None:
    """Largest |difference| of the frames each ratio's two arms made this repeat."""
    for name, a, b in RATIOS:
        if a in report.arms and b in report.arms:
            frames = [torch.cat(report.arms[x].frames).int() for x in (a, b)]
            diff = int((frames[0] - frames[1]).abs().max())
            report.max_abs_frame_diff[name] = max(report.max_abs_frame_diff.get(name, 0), diff)


def _sweep_point(arm: RunnerArm, frames_total: int) -> dict[str, int]:
    runner = arm.runner
    blocks = ceil_div(frames_total, runner.plan.spec.frames_per_block)
    pages_max = 0
    arm.open(f"sweep-{frames_total}", fill=False)
    for _ in range(blocks):
        arm.advance()
        pages_max = max(pages_max, runner.cache.stats().pages_in_use or 0)
    arm.close()
    return {"frames": blocks * runner.plan.spec.frames_per_block,
            "pages_in_use_max": pages_max, "rss_bytes": current_rss_bytes()}

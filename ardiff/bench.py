"""Side-by-side measurements of the paged runtime against the dense reference (`ardiff bench`).

In one process, the same pipeline and seed run on both backends, alternating
(paged, dense, paged, dense, ...) after a warmup, each repeat on a fresh
session whose window is filled before timing starts. Ratios are taken from
runs measured side by side, so a noisy machine moves both arms alike. Targets
are printed by the CLI, never asserted.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ardiff.config.run import RunConfig, with_base_dir
from ardiff.engine.build import build_runner, resolve
from ardiff.contract.forward import RolloutRequest
from ardiff.engine.runner import Runner
from ardiff.kv.backend import BACKENDS
from ardiff.sizes import ceil_div
from ardiff.rollout.report import peak_rss_bytes, percentile

FILL_EXTRA = {"q_tokens": 1}
ENCODE_MIN_BLOCKS = 32  # pipelines that support it fill the window with cheap queries


@dataclass
class BackendResult:
    backend: str
    latencies_s: list[float] = field(default_factory=list)
    kv_bytes_allocated: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.latencies_s)

    @property
    def spread_s(self) -> tuple[float, float]:
        """10th and 90th percentile of the per-block latency."""
        return percentile(self.latencies_s, 10), percentile(self.latencies_s, 90)


@dataclass
class BenchReport:
    blocks: int
    repeats: int
    plan_min_bytes: int
    results: dict[str, BackendResult]
    max_abs_diff: int
    encode_s: float = 0.0
    plain_s: float = 0.0
    sweep: list[dict[str, int]] = field(default_factory=list)
    peak_rss_bytes: int = 0

    @property
    def latency_ratio(self) -> float:
        return self.results["paged"].median_s / self.results["dense"].median_s

    def kv_ratio(self, backend: str) -> float:
        return self.results[backend].kv_bytes_allocated / self.plan_min_bytes

    @property
    def encode_overhead(self) -> float | None:
        return (self.encode_s - self.plain_s) / self.plain_s if self.plain_s else None

    @property
    def rss_growth(self) -> float | None:
        if len(self.sweep) < 2:
            return None
        return self.sweep[-1]["rss_bytes"] / self.sweep[0]["rss_bytes"] - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks, "repeats": self.repeats,
            "backends": {name: {"median_block_s": r.median_s, "p10_block_s": r.spread_s[0],
                                "p90_block_s": r.spread_s[1], "kv_bytes_allocated":
                                r.kv_bytes_allocated, "kv_bytes_vs_plan_min": self.kv_ratio(name)}
                         for name, r in self.results.items()},
            "paged_over_dense": self.latency_ratio,
            "max_abs_frame_diff": self.max_abs_diff,
            "plan_min_bytes": self.plan_min_bytes,
            "encode": {"with_s": self.encode_s, "without_s": self.plain_s,
                       "overhead": self.encode_overhead},
            "sweep": self.sweep, "rss_growth": self.rss_growth,
            "peak_rss_bytes": self.peak_rss_bytes,
        }


def current_rss_bytes() -> int:
    """Resident set size now (Linux: /proc/self/statm counts pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _runners(config: RunConfig) -> dict[str, Runner]:
    """One runner per backend over one loaded pipeline, each sized for one session."""
    runtime = dataclasses.replace(config.runtime, max_sessions=1)
    config = with_base_dir(dataclasses.replace(config, runtime=runtime), config.base_dir)
    resolved = resolve(config)
    return {backend: build_runner(config, resolved, load_weights=i == 0, backend=backend)
            for i, backend in enumerate(BACKENDS)}


class _Driver:
    """Runs fill + measured blocks of one session and keeps what it saw."""

    def __init__(self, runner: Runner, config: RunConfig) -> None:
        self.runner, self.config = runner, config
        spec = runner.plan.spec
        self.fill_blocks = ceil_div(spec.sink_frames + spec.window_frames, spec.frames_per_block)

    def request(self, session_id: str, block_index: int, fill: bool) -> RolloutRequest:
        r = self.config.rollout
        prompt = r.prompt if isinstance(r.prompt, str) else r.prompt[0].prompt
        return RolloutRequest(session_id, block_index=block_index, prompt=prompt, seed=r.seed,
                              num_steps=r.num_steps, guidance_scale=r.guidance_scale,
                              extra=dict(FILL_EXTRA) if fill else {})

    def run(self, session_id: str, blocks: int, on_frames: Callable | None = None):
        latencies, frames, peak_bytes = [], [], 0
        for i in range(self.fill_blocks + blocks):
            fill = i < self.fill_blocks
            start = time.perf_counter()
            out = self.runner.execute(self.request(session_id, i, fill)).output
            if on_frames is not None and not fill:
                on_frames(out.frames)
            if not fill:
                latencies.append(time.perf_counter() - start)
                frames.append(out.frames)
            peak_bytes = max(peak_bytes, self.runner.cache.stats().kv_bytes_allocated)
        self.runner.close_session(session_id)
        return latencies, torch.cat(frames), peak_bytes


def run_bench(config: RunConfig, blocks: int = 4, repeats: int = 3,
              sweep_frames: list[int] | None = None, encode: bool = True,
              on_progress: Callable[[str], None] | None = None) -> BenchReport:
    """Measure paged vs dense, and optionally encode overhead and RSS against length.

    The runners it builds are closed on every exit, an exception included."""
    say = on_progress or (lambda message: None)
    runners = _runners(config)
    try:
        report = _measure(runners, config, blocks, repeats, say)
        paged = _Driver(runners["paged"], config)
        if encode:
            _measure_encode(paged, config, blocks, repeats, report, say)
        for frames_total in sweep_frames or []:
            say(f"sweep: {frames_total} frames")
            report.sweep.append(_sweep_point(paged, frames_total))
        report.peak_rss_bytes = peak_rss_bytes()
        return report
    finally:
        for runner in runners.values():
            runner.close()


def _measure(runners: dict[str, Runner], config: RunConfig, blocks: int, repeats: int,
             say: Callable[[str], None]) -> BenchReport:
    """Warm up, then the alternating paged / dense repeats; frames must agree."""
    drivers = {name: _Driver(runner, config) for name, runner in runners.items()}
    say("warmup")
    for runner in runners.values():
        runner.warmup()
    plan = runners["paged"].plan
    results = {name: BackendResult(name) for name in BACKENDS}
    max_diff = 0
    for rep in range(repeats):
        frames = {}
        for name in BACKENDS:  # alternating arms: paged, dense, paged, dense, ...
            say(f"repeat {rep + 1}/{repeats}: {name}")
            latencies, frames[name], peak = drivers[name].run(f"bench-{name}-{rep}", blocks)
            results[name].latencies_s += latencies
            results[name].kv_bytes_allocated = max(results[name].kv_bytes_allocated, peak)
        max_diff = max(max_diff, int((frames["paged"].int() - frames["dense"].int()).abs().max()))
    return BenchReport(blocks, repeats, plan.page_bytes * plan.total_pages, results, max_diff)


def _measure_encode(driver: _Driver, config: RunConfig, blocks: int, repeats: int,
                    report: BenchReport, say: Callable[[str], None]) -> None:
    """The same rollout with and without encoding to mp4, alternating.

    At least ENCODE_MIN_BLOCKS blocks per arm, so the per-file cost of opening
    and finalizing the container is weighed against a rollout of some length.
    """
    from ardiff.video.writer import VideoWriter

    blocks = max(blocks, ENCODE_MIN_BLOCKS)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            say(f"encode {rep + 1}/{repeats}")
            start = time.perf_counter()
            driver.run(f"plain-{rep}", blocks)
            report.plain_s += time.perf_counter() - start
            start = time.perf_counter()
            out = config.output
            writer = VideoWriter(Path(tmp) / f"bench-{rep}.mp4", out.fps, codec=out.codec,
                                 crf=out.crf, preset=out.preset)
            driver.run(f"encode-{rep}", blocks, on_frames=writer.write)
            writer.close()
            report.encode_s += time.perf_counter() - start


def _sweep_point(driver: _Driver, frames_total: int) -> dict[str, int]:
    spec = driver.runner.plan.spec
    per_block = spec.frames_per_block
    blocks = ceil_div(frames_total, per_block)
    pages_max = 0
    session_id = f"sweep-{frames_total}"
    for i in range(blocks):
        driver.runner.execute(driver.request(session_id, i, fill=False))
        pages_max = max(pages_max, driver.runner.cache.stats().pages_in_use or 0)
    driver.runner.close_session(session_id)
    return {"frames": blocks * per_block, "pages_in_use_max": pages_max,
            "rss_bytes": current_rss_bytes()}


"""`run_batch_bench`: B sessions advanced together by `Runner.execute_batch`, for each B.

    report = run_batch_bench(config, [1, 2, 4, 8], blocks=8, repeats=3)

    arms:      one per batch size B: a runner over the one loaded pipeline holding B sessions
               (row j: seed + j, `rollout.prompts` in turn), planned for B blocks in flight
    repeat r:  every arm opens B fresh sessions and fills their windows (batched, untimed);
               then step i runs one batched block on every arm in turn, the order rotating
               and reversing per step (`run.block_order`): B1 B2 B4 B8 | B8 B4 B2 B1 | ...
    frames:    row 0 of every arm against the B=1 arm, each repeat; rows 1.. against the
               same session run alone (one untimed pass over repeat 0's requests)

Speedup is paired per step: B=1's time per frame over B's, at nearly the same moment. A
pipeline without `generate_blocks` still runs (one session per forward); `forwards` says
how many sessions each forward served.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ardiff.bench.arms import Times, block_request, fill_blocks
from ardiff.bench.lengths import check_batch_sizes, check_counts, check_positions
from ardiff.bench.machine import load_average, machine_record
from ardiff.bench.run import _eager, _with_runtime, block_order
from ardiff.bench.spread import Spread, paired_ratios
from ardiff.config.run import RunConfig
from ardiff.engine.batching import supports_batches
from ardiff.engine.build import ResolvedPipeline, build_runner, resolve
from ardiff.engine.runner import Runner
from ardiff.errors import CapacityError, ConfigError
from ardiff.rollout.batches import max_batch_size
from ardiff.rollout.inputs import pipeline_actions, read_actions
from ardiff.rollout.report import peak_rss_bytes

NO_BATCHES = ("the pipeline has no generate_blocks (SupportsARDiffusionBatchGeneration): "
              "B sessions run one per forward")


@dataclass
class BatchArm:
    """B sessions of one runner, advanced together: one `execute_batch` per step."""

    size: int
    runner: Runner
    config: RunConfig
    fill: int
    times: Times = field(default_factory=Times)
    frames_made: list[int] = field(default_factory=list)  # per timed step, every row
    rows: list[list[torch.Tensor]] = field(default_factory=list)  # this repeat's, per row
    pages_max: int = 0
    forwards: Counter[int] = field(default_factory=Counter)  # timed: sessions -> forwards
    block: int = 0
    session_ids: list[str] = field(default_factory=list)

    def open(self, tag: str) -> None:
        """B fresh sessions, their windows filled (untimed)."""
        self.block, self.rows = 0, [[] for _ in range(self.size)]
        self.session_ids = [f"bench-b{self.size}-{tag}-{row}" for row in range(self.size)]
        for _ in range(self.fill):
            self.runner.execute_batch(self.requests(fill=True))
            self.block += 1

    def requests(self, fill: bool) -> list[Any]:
        return [block_request(self.config, sid, self.block, fill, row)
                for row, sid in enumerate(self.session_ids)]

    def step(self) -> None:
        """One timed block of every session: wall and model-thread CPU of the forward(s)."""
        requests = self.requests(fill=False)
        before = Counter(self.runner.batch_sizes)
        wall, cpu = time.perf_counter(), time.thread_time()
        results = self.runner.execute_batch(requests)
        frames = [result.output.frames for result in results]
        if frames[0].is_cuda:  # execute_batch returns before the device is done
            torch.cuda.synchronize(frames[0].device)
        self.times.cpu_s.append(time.thread_time() - cpu)
        self.times.wall_s.append(time.perf_counter() - wall)
        self.forwards.update(self.runner.batch_sizes - before)
        self.frames_made.append(sum(int(f.shape[0]) for f in frames))
        for row, row_frames in enumerate(frames):
            self.rows[row].append(row_frames.cpu())
        self.pages_max = max(self.pages_max, self.runner.cache.stats().pages_in_use or 0)
        self.block += 1

    def close(self) -> None:
        for sid in self.session_ids:
            self.runner.close_session(sid)


@dataclass
class BatchBenchReport:
    """Per batch size: block times, frames made, frame differences, pages; see `to_dict`."""

    blocks: int
    repeats: int
    threads: int
    pipeline: str  # its class, module:name
    batched: bool
    arms: dict[int, BatchArm]
    max_abs_frame_diff: dict[int, int] = field(default_factory=dict)
    rows_checked: dict[int, int] = field(default_factory=dict)
    warmup_s: float = 0.0
    peak_rss_bytes: int = 0
    load_before: list[float] = field(default_factory=load_average)
    load_after: list[float] = field(default_factory=list)

    def speedup(self, size: int, kind: str = "wall_s") -> Spread | None:
        """Paired per step: B=1's time per frame over this size's (None: no B=1 arm)."""
        if 1 not in self.arms:
            return None
        one, arm = self.arms[1], self.arms[size]
        per_frame = [[t / n for t, n in zip(getattr(a.times, kind), a.frames_made)]
                     for a in (one, arm)]
        return Spread.of(paired_ratios(per_frame[0], per_frame[1]))

    def to_dict(self) -> dict[str, Any]:
        sizes = []
        for size, arm in self.arms.items():
            per_s = [n / t for n, t in zip(arm.frames_made, arm.times.wall_s)]
            speedups = {kind: self.speedup(size, f"{kind}_s") for kind in ("wall", "cpu")}
            plan = arm.runner.plan
            sizes.append({
                "batch": size,
                "forwards": {str(k): v for k, v in sorted(arm.forwards.items())},
                "block_wall_s": _spread(arm.times.wall_s),
                "block_cpu_s": _spread(arm.times.cpu_s),
                "blocks": {"wall_s": list(arm.times.wall_s), "cpu_s": list(arm.times.cpu_s),
                           "frames": list(arm.frames_made)},  # one entry per timed block
                "frames_per_s": _spread(per_s),
                "frames": sum(arm.frames_made),
                "speedup": {kind: None if s is None else s.to_dict()
                            for kind, s in speedups.items()},
                "max_abs_frame_diff": self.max_abs_frame_diff.get(size),
                "rows_checked": self.rows_checked.get(size, 0),
                "pages_in_use_max": arm.pages_max, "pages_total": plan.total_pages,
                "kv_bytes_allocated": arm.runner.cache.stats().kv_bytes_allocated,
            })
        return {
            "mode": "batch", "blocks": self.blocks, "repeats": self.repeats,
            "pipeline": self.pipeline, "batched": self.batched,
            "notice": None if self.batched else NO_BATCHES,
            "machine": machine_record(self.threads, self.load_before, self.load_after),
            "sizes": sizes, "warmup_s": self.warmup_s, "peak_rss_bytes": self.peak_rss_bytes,
        }


def _spread(values: list[float]) -> dict[str, float] | None:
    spread = Spread.of(values)
    return None if spread is None else spread.to_dict()


def run_batch_bench(config: RunConfig, sizes: list[int], blocks: int = 8, repeats: int = 3,
                    threads: int = 1,
                    on_progress: Callable[[str], None] | None = None) -> BatchBenchReport:
    """Measure B sessions per forward for each B of `sizes` (B=1, the baseline, is added
    when missing), side by side over one loaded pipeline. Counts, sizes and lengths raise
    ConfigError before anything loads; a size the memory plan cannot hold resident raises
    CapacityError. Torch runs `threads` threads meanwhile (restored after); every runner
    it builds is closed on every exit."""
    say = on_progress or (lambda message: None)
    check_counts(blocks, repeats, threads, [])
    check_batch_sizes(sizes)
    sizes = sorted({1, *sizes})
    eager = _eager(config)
    resolved = resolve(eager)
    check_positions(resolved.spec, resolved.pipeline, config, blocks, [], encode=False)
    read_actions(config.rollout.actions, config.base_dir, pipeline_actions(resolved.pipeline),
                 resolved.spec.frames_per_block)  # checked as a rollout checks them
    _check_pipeline_holds(resolved, sizes)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    runners: dict[int, Runner] = {}
    try:
        arms = _build_arms(resolved, sizes, runners, say)
        say(f"warmup: B={sizes[0]}")
        pipeline = type(resolved.pipeline)
        report = BatchBenchReport(blocks, repeats, threads,
                                  f"{pipeline.__module__}:{pipeline.__qualname__}",
                                  supports_batches(resolved.pipeline), arms,
                                  warmup_s=runners[1].warmup().total_s)
        first: dict[int, list[list[torch.Tensor]]] = {}
        for rep in range(repeats):
            say(f"repeat {rep + 1}/{repeats}: B = {', '.join(map(str, sizes))}, alternating "
                f"per block")
            _alternate(list(arms.values()), blocks, rep)
            if rep == 0:
                first = {size: [list(rows) for rows in arm.rows] for size, arm in arms.items()}
            _compare_row0(report)
            for arm in arms.values():
                arm.close()
        say("frames: each row alone")
        _compare_alone(report, first, say)
        report.peak_rss_bytes = peak_rss_bytes()
        report.load_after = load_average()
        return report
    finally:
        for runner in runners.values():
            runner.close()
        torch.set_num_threads(previous_threads)


def _check_pipeline_holds(resolved: ResolvedPipeline, sizes: list[int]) -> None:
    """The largest B within the pipeline's `max_batch_size` and its spec's session cap."""
    largest = max(sizes)
    most = max_batch_size(resolved.pipeline) if supports_batches(resolved.pipeline) else None
    if most is not None and largest > most:
        raise ConfigError(f"--batch: {largest} sessions in one forward, but the pipeline's "
                          f"max_batch_size is {most}; use batch sizes up to {most}")
    cap = resolved.spec.session_capacity
    if largest > cap:
        raise ConfigError(f"--batch: {largest} sessions at once, but the pipeline's spec holds "
                          f"at most {cap} resident (its session_capacity); use batch sizes up "
                          f"to {cap}, or raise it where the pipeline takes it (e.g. --set "
                          f"pipeline.args.session_capacity={largest})")


def _build_arms(resolved: ResolvedPipeline, sizes: list[int], runners: dict[int, Runner],
                say: Callable[[str], None]) -> dict[int, BatchArm]:
    """A runner per size over the one pipeline (loaded once), holding B sessions with B
    blocks in flight; CapacityError when the memory plan holds fewer."""
    fill = fill_blocks(resolved.spec)
    arms = {}
    for i, size in enumerate(sizes):
        say(f"runner: B={size}")
        config = _with_runtime(resolved.config, max_sessions=size)
        runner = build_runner(config, dataclasses.replace(resolved, config=config),
                              load_weights=i == 0, batch_rows=size)
        runners[size] = runner
        rows = runner.plan.batch_rows if supports_batches(resolved.pipeline) else size
        held = min(runner.sessions.capacity, rows)
        if held < size:
            raise CapacityError(f"--batch: {size} sessions in one forward, but "
                                f"runtime.memory_budget ({config.runtime.memory_budget}) holds "
                                f"{held} with their blocks in flight; use smaller batch "
                                f"sizes, or raise runtime.memory_budget")
        arms[size] = BatchArm(size, runner, resolved.config, fill)
    return arms


def _alternate(arms: list[BatchArm], blocks: int, rep: int) -> None:
    for arm in arms:
        arm.open(str(rep))
    for i in range(blocks):
        for arm in block_order(arms, rep * blocks + i):
            arm.step()


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    return int((torch.cat(a).int() - torch.cat(b).int()).abs().max())


def _compare_row0(report: BatchBenchReport) -> None:
    """Row 0 of every arm against the B=1 arm's session (the same requests), this repeat."""
    one = report.arms[1].rows[0]
    for size, arm in report.arms.items():
        if size == 1:
            continue
        diff = _max_diff(arm.rows[0], one)
        report.max_abs_frame_diff[size] = max(report.max_abs_frame_diff.get(size, 0), diff)
        report.rows_checked[size] = 1


def _compare_alone(report: BatchBenchReport, first: dict[int, list[list[torch.Tensor]]],
                   say: Callable[[str], None]) -> None:
    """Rows 1.. of repeat 0 against each session run alone on the B=1 runner (untimed)."""
    one = report.arms[1]
    largest = max(report.arms)
    for row in range(1, largest):
        say(f"frames: row {row} alone")
        sid = f"bench-alone-{row}"
        frames = []
        for block in range(one.fill + report.blocks):
            request = block_request(one.config, sid, block, block < one.fill, row)
            if block >= one.fill:
                frames.append(one.runner.execute(request).output.frames.cpu())
            else:
                one.runner.execute(request)
        one.runner.close_session(sid)
        for size, rows in first.items():
            if size > row:
                diff = _max_diff(rows[row], frames)
                report.max_abs_frame_diff[size] = max(report.max_abs_frame_diff[size], diff)
                report.rows_checked[size] += 1

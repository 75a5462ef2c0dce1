"""Several prompts in one forward: the batch a rollout uses, and the blocks it runs.

    rows = planned_batch(config.rollout.batch, pipeline, config, spec, len(plan.streams))
    runner = build_runner(config, resolved, batch_rows=rows)     # the plan holds `rows` blocks
    batch, notice = choose_batch(config.rollout.batch, runner, len(plan.streams))
    blocks = BatchedBlocks(batch, frames_lag=...)   # a block source for run_rollout
    for event in blocks(runner, plan): ...          # each forward's blocks, in stream order

Up to `batch` streams advance together, block by block: one `Runner.execute_batch` per
step, each stream's frames to its own file. A stream that is done leaves the batch (its
session closed once its frames were handed on) and the next waiting one takes its place;
under `rollout.interleave` a round is every stream, in batches. Only the last event of a
forward has `ends_forward`: a stop is polled there, so a batch's streams end together.
A forward runs through `Runner.execute_rows`: a failing row that committed nothing fails
its own stream only (it leaves the batch, its file keeping the frames it made) and the
others go on to their last frame; then the first stream's error ends the rollout (failed).

    forward 1:  stream-0 b0 | stream-1 b0 | stream-2 b0      batch 3, 4 prompts
    forward 2:  stream-0 b1 | stream-1 b1 | stream-2 b1      (each done after 2 blocks)
    forward 3:  stream-3 b0                                   what is left
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

from ardiff.config.run import RunConfig
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.engine.batching import supports_batches
from ardiff.errors import PipelineLoadError
from ardiff.kv.plan import KVPlan
from ardiff.rollout.streams import BlockEvent, RolloutPlan, Stream, build_request

if TYPE_CHECKING:  # pragma: no cover - typing only: the runner imports torch
    from ardiff.engine.runner import BlockResult, Runner


def planned_batch(requested: int | None, pipeline: object, config: RunConfig,
                  spec: ARDiffusionKVCacheSpec, num_streams: int) -> int:
    """The most sessions one forward will run, for the KV plan to hold their blocks in flight
    (`build_runner(batch_rows=)`), known before the plan: 1 for a pipeline without
    `generate_blocks`; else `requested`, or (None: auto) min(prompts, the spec's and
    `runtime.max_sessions`' session cap, the pipeline's `max_batch_size`): never more than
    can run (`choose_batch` says so when that is fewer than asked)."""
    if not supports_batches(pipeline):
        return 1
    most = max_batch_size(pipeline)
    wanted = num_streams if requested is None else min(requested, num_streams)
    limits = (wanted, spec.session_capacity, config.runtime.max_sessions, most)
    return max(1, min(limit for limit in limits if limit is not None))


def choose_batch(requested: int | None, runner: Runner, num_streams: int,
                 agree_min: Callable[[int], int] | None = None,
                 max_sessions: int | None = None) -> tuple[int, str | None]:
    """The batch a rollout of `num_streams` prompts uses, and a notice when it is fewer than
    asked (`requested`, or every prompt under auto): the most that fit, min(prompts,
    resident sessions, the plan's `batch_rows`, the pipeline's `max_batch_size`), the
    notice naming the limit that binds (`max_sessions`: `runtime.max_sessions`, to name
    it). `agree_min`: a parallel job's minimum over its ranks, taken of the memory's limit,
    so the ranks of a CFG group (the same prompts) run the same batches."""
    if not supports_batches(runner.pipeline):
        if requested in (None, 1):
            return 1, None
        return 1, (f"rollout.batch: {requested}, but the pipeline has no generate_blocks "
                   f"(SupportsARDiffusionBatchGeneration): one session per forward")
    plan, most = runner.plan, max_batch_size(runner.pipeline)
    limits = {"resident": min(runner.sessions.capacity, plan.batch_rows)}
    if agree_min is not None:
        limits["resident"] = agree_min(limits["resident"])
    if most is not None:
        limits["pipeline"] = most
    wanted = num_streams if requested is None else min(requested, num_streams)
    batch = max(1, min(wanted, *limits.values()))
    if batch >= wanted:
        return batch, None
    asked = "auto" if requested is None else str(requested)
    return batch, (f"rollout.batch: {asked} for {num_streams} prompts runs {batch} per "
                   f"forward, the most that fit: {_binding(limits, batch, plan, max_sessions)}")


def _binding(limits: dict[str, int], batch: int, plan: KVPlan, max_sessions: int | None) -> str:
    if limits.get("pipeline") == batch:
        return f"the pipeline's max_batch_size is {batch}"
    if plan.batch_rows == batch and plan.session_capacity > batch:
        return (f"runtime.memory_budget holds the blocks of {batch} sessions in flight at "
                f"once; raise runtime.memory_budget for more")
    return f"{plan.binding_limit(max_sessions)} keeps {plan.session_capacity} sessions resident"


def max_batch_size(pipeline: object) -> int | None:
    """The pipeline's optional `max_batch_size` (None: no limit of its own)."""
    value = getattr(pipeline, "max_batch_size", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PipelineLoadError(f"pipeline: max_batch_size is {value!r}; it must be an integer "
                                f">= 1 (the most sessions generate_blocks takes in one "
                                f"forward), or leave it undefined for no limit")
    return int(value)


@dataclass(frozen=True)
class BatchedBlocks:
    """A block source (`run_rollout(..., blocks=)`) running `batch` streams per forward.
    `frames_lag`: events a block's frames wait before the writer gets them (None: the
    device's: one block on CUDA, which is a whole batch here)."""

    batch: int
    frames_lag: int | None = None

    def __call__(self, runner: Runner, plan: RolloutPlan) -> Iterator[BlockEvent]:
        written = {stream.index: 0 for stream in plan.streams}
        made = dict(written)  # blocks made per stream
        pending = list(plan.streams)
        failed: list[Exception] = []  # the failed streams' errors, in the order they came
        while pending:
            step = list(pending if plan.interleave else pending[:self.batch])
            for start in range(0, len(step), self.batch):
                group = step[start:start + self.batch]
                yield from _forward(runner, plan, group, written, made, failed)
                for stream in group:  # closed after their frames were handed on
                    if stream.session_id not in runner.sessions:  # it failed: released
                        pending.remove(stream)
                    elif written[stream.index] >= plan.frames:
                        pending.remove(stream)
                        runner.close_session(stream.session_id)
        if failed:
            raise failed[0]


def _forward(runner: Runner, plan: RolloutPlan, group: list[Stream], written: dict[int, int],
             made: dict[int, int], failed: list[Exception]) -> Iterator[BlockEvent]:
    """One forward for the next block of every stream of `group`, its events in order; a
    row that failed yields nothing, its error added to `failed`."""
    requests = [build_request(plan, stream, made[stream.index]) for stream in group]
    results = runner.execute_rows(requests)
    rows: list[tuple[Stream, BlockResult]] = []
    for stream, result in zip(group, results):
        if isinstance(result, Exception):
            failed.append(result)
        else:
            rows.append((stream, result))
    if not rows:
        raise failed[0]  # the whole forward failed (it had committed): nothing goes on
    for row, (stream, result) in enumerate(rows):
        frames = result.output.frames[:plan.frames - written[stream.index]]
        written[stream.index] += int(frames.shape[0])
        made[stream.index] += 1
        yield BlockEvent(stream, made[stream.index] - 1, frames, result.latency,
                         written[stream.index], ends_forward=row == len(rows) - 1,
                         started_s=result.started_s, stages_s=result.stages_s)

"""A whole rollout job in one process: check, load, warm up, run, encode, report.

    report = run_rollout(config, on_event=callback, stop=RolloutStop())

Bad input (config, spec, output path, capacity) raises before anything is computed or
created. Once the rollout starts, every failure (the pipeline or encoder raising, a
pipeline calling `sys.exit`, Ctrl-C) ends in the report as `failed` or `interrupted`, the
files finalized with every finished frame. Stopping is cooperative: the job polls `stop`
at safe points (before warmup, before the first block, after each block reaches the
writer), so no file is left half-written; while `stop.phase` is `loading` or `warmup`, or
the job runs the pipeline's code (`stop.gate.pipeline_since`), a caller may raise
KeyboardInterrupt instead; where that code never returns, another thread may take the
files over and finalise them (`stop.gate.take_over`, ardiff.rollout.gate). A job of
several processes is `ardiff.launch`'s: each rank runs its `JobShare` through this
function. Up to `rollout.batch` prompts advance together, one forward per block for all
(`ardiff.rollout.batches`); each still has its own file. Nothing prints.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from ardiff.config.run import RunConfig
from ardiff.distributed.context import ParallelContext
from ardiff.engine.build import ResolvedPipeline, build_runner, resolve
from ardiff.engine.timing import Latency, seconds
from ardiff.errors import (
    ArdiffError,
    ConfigError,
    WarmupError,
)
from ardiff.rollout.batches import BatchedBlocks, choose_batch, planned_batch
from ardiff.rollout.gate import FileGate
from ardiff.rollout.handoff import FrameHandoff, frames_lag, make_handoff
from ardiff.rollout.inputs import ignored_prompt_warnings, pipeline_actions, prompt_warnings
from ardiff.rollout.outcome import record_failure, record_interrupt
from ardiff.rollout.paths import check_rollout_paths
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import OutputRecord, RolloutReport, batching_record, peak_rss_bytes
from ardiff.rollout.share import JobShare
from ardiff.rollout.stop import RolloutStop
from ardiff.rollout.streams import (
    BlockEvent,
    RolloutPlan,
    Stream,
    check_capacity,
    iter_rollout,
    latent_frame_map,
    plan_rollout,
    video_frames_per_block,
)
from ardiff.video.writer import VideoInfo, VideoWriter, check_output_path

if TYPE_CHECKING:  # pragma: no cover - typing only: the runner imports torch
    from ardiff.engine.runner import Runner

BlockSource = Callable[["Runner", RolloutPlan], Iterator[BlockEvent]]  # (runner, plan) -> blocks


class Deliver(Protocol):
    """`_run`'s writer of ready blocks: True when a stop was polled."""

    def __call__(self, ready: Iterator[BlockEvent], poll: bool = True) -> bool: ...


@dataclass
class Files:
    """What a rollout writes: a writer per stream (opened at its first frames), the blocks
    on their way to them, and the gate over the files (`gate`, set by the job)."""

    config: RunConfig
    plan: RolloutPlan
    handoff: FrameHandoff
    writes: bool  # False: a CFG rank that makes the frames its peer writes
    batch: int = 1  # streams per forward (`ardiff.rollout.batches`)
    gate: FileGate = field(init=False)
    writers: dict[int, VideoWriter] = field(default_factory=dict)
    start: float | None = None  # time.perf_counter() when the rollout began
    latencies: dict[int, list[Latency]] = field(default_factory=dict)  # per stream, per block


def run_rollout(config: RunConfig, on_event: Callable[[ProgressEvent], None] | None = None,
                stop: RolloutStop | None = None, share: JobShare | None = None,
                blocks: BlockSource | None = None) -> RolloutReport:
    """Run the rollout the config describes; return its report (status ok/failed/interrupted).

    `stop` is polled at safe points (see the module docstring); None: run to the end.
    `share`: this process's part of a parallel job (None: the whole job, which must
    be one process's: `ardiff.launch.run_job` chooses). `blocks` drives the runner (default: the
    plan's blocks, `rollout.batch` streams per forward; `ardiff.rollout.live` steps one
    block at a time with actions chosen as it goes). Raises ardiff errors only before the
    rollout starts (bad input, capacity, batch, loading).
    """
    if share is None and needs_processes(config):
        raise ConfigError(f"runtime.parallel: {config.runtime.parallel.world_size} processes "
                          f"(launcher {config.runtime.parallel.launcher}) are a job for "
                          f"ardiff.launch.run_job; run_rollout runs one process")
    emit = on_event or (lambda event: None)
    stop = stop or RolloutStop()
    share = share or JobShare()
    resolved, plan = prepare_rollout(config, share.context)
    plan = share.select(plan)
    rows = 1 if blocks is not None else planned_batch(
        config.rollout.batch, resolved.pipeline, config, resolved.spec, len(plan.streams))
    runner = build_runner(config, resolved, agree_min=share.agree_min, batch_rows=rows)
    try:
        check_capacity(plan, runner.plan, config.runtime.max_sessions)
        batch, notice = (1, None) if blocks is not None else choose_batch(
            config.rollout.batch, runner, len(plan.streams), share.agree_min,
            config.runtime.max_sessions)
    except BaseException:
        runner.close()
        raise
    report = _new_report(config, plan, runner)
    report.warnings.extend([notice] if notice else [])
    report.warnings.extend(plan.warnings)  # prompt switches moved to a block boundary
    report.warnings.extend(prompt_warnings(runner.pipeline, config, plan))  # asked after load
    report.warnings.extend(ignored_prompt_warnings(runner.pipeline, config))
    if blocks is None:  # a batch's frames wait for the next forward, as one block's would
        blocks = (iter_rollout if batch == 1
                  else BatchedBlocks(batch, frames_lag(runner.device) * batch))
    files = Files(config, plan, make_handoff(runner, getattr(blocks, "frames_lag", None)),
                  share.writes, batch)
    files.gate = stop.gate = FileGate(lambda: _abandon(report, stop, files, runner))
    try:
        _warm_up_and_run(runner, plan, config, report, emit, stop, blocks, files)
    finally:
        _close_runner(runner, report, files.gate)
        files.gate.close()
    _finish_report(report, runner, files)
    stop.phase = "done"
    emit(ProgressEvent("done", report.frames_written, report.frames_requested))
    return report


def needs_processes(config: RunConfig) -> bool:
    """Whether `runtime.parallel` asks for more than this one process (or torchrun's ranks)."""
    parallel = config.runtime.parallel
    return parallel.world_size > 1 or parallel.launcher == "env"


def prepare_rollout(config: RunConfig, context: ParallelContext | None = None
                    ) -> tuple[ResolvedPipeline, RolloutPlan]:
    """Everything checked before any compute: the pipeline built (not loaded) and its spec,
    the plan of every stream, the paths. `context`: a CFG-parallel rank's (None: a dry one).
    Raises ConfigError / OutputPathError / SpecError."""
    resolved = resolve(config, parallel=context)
    spec = resolved.spec
    per_block, first_block = video_frames_per_block(resolved.pipeline, spec.frames_per_block)
    plan = plan_rollout(config, spec, per_block, first_block, pipeline_actions(resolved.pipeline),
                        latent_frame_map(resolved.pipeline))
    check_rollout_paths(config, [stream.output_path for stream in plan.streams],
                        pipeline=resolved.pipeline)
    out = config.output
    for stream in plan.streams:
        check_output_path(stream.output_path, out.codec, out.crf, out.preset, out.scale)
    return resolved, plan


def _new_report(config: RunConfig, plan: RolloutPlan, runner: Runner) -> RolloutReport:
    return RolloutReport(pipeline=config.pipeline.entry, device=str(runner.device),
                         dtype=runner.plan.dtype,  # runtime.dtype, auto resolved
                         frames_requested=plan.frames * len(plan.streams),
                         output_fps=config.output.fps)


def _warm_up_and_run(runner: Runner, plan: RolloutPlan, config: RunConfig, report: RolloutReport,
                     emit: Callable[[ProgressEvent], None], stop: RolloutStop,
                     blocks: BlockSource, files: Files) -> None:
    """Warmup, then the rollout, each only if nothing stopped the job before it."""
    try:
        if config.warmup.enabled and not _stopped(report, stop):
            stop.phase = "warmup"
            emit(ProgressEvent("warmup", 0, report.frames_requested))
            with files.gate.pipeline():
                _warmup(runner, report)
        if report.status == "ok" and not _stopped(report, stop):
            _run(runner, plan, config, report, emit, stop, blocks, files)
    except BaseException as exc:  # noqa: BLE001 - e.g. Ctrl-C between the steps: still a report
        if report.status == "ok":
            record_failure(report, exc)
    finally:
        stop.phase = "closing"  # every file is final: the runner and the report are left


def _warmup(runner: Runner, report: RolloutReport) -> None:
    try:
        warmup = runner.warmup()
    except WarmupError as exc:
        report.warnings.append(f"{exc}; continuing without warmup")
        return
    report.warmup_s = warmup.total_s
    if warmup.skipped_reason:
        report.warnings.append(f"warmup skipped: {warmup.skipped_reason}")
    if warmup.leaked_pages:
        report.warnings.append(f"warmup leaked {warmup.leaked_pages} KV pages")


def _run(runner: Runner, plan: RolloutPlan, config: RunConfig, report: RolloutReport,
         emit: Callable[[ProgressEvent], None], stop: RolloutStop, blocks: BlockSource,
         files: Files) -> None:
    """The blocks, each handed to its stream's writer (`files.writes` False: counted, not
    written: a CFG group's second rank makes the frames its first rank writes).

    On CUDA frames reach the writer one block late (`ardiff.rollout.handoff`). A stop
    polled after block i drops block i+1's frames, so the files end where a CPU run's
    would; a failure writes every block that finished before it. Making a block (and, on
    CUDA, waiting for its frames) runs with the files let go (`files.gate`). Of a batched
    forward's blocks, a stop is polled after the last (`BlockEvent.ends_forward`)."""
    stop.phase = "rollout"  # before the first file opens: from here a stop must be requested
    writers, handoff, gate, writes = files.writers, files.handoff, files.gate, files.writes
    start = files.start = time.perf_counter()

    def deliver(ready: Iterator[BlockEvent], poll: bool = True) -> bool:
        """Write the ready blocks; True when a stop was polled (`poll` False: after a
        failure, when a parallel rank's poll would wait for peers that may be gone)."""
        for event in gate.steps(ready):
            with gate.files():
                handed = time.perf_counter()
                _write(event, writers, config, report, writes)
                encode_wait_s = time.perf_counter() - handed
                if report.time_to_first_frame_s is None:
                    report.time_to_first_frame_s = time.perf_counter() - start
                if event.frames_written >= plan.frames and event.stream.index in writers:
                    _close_writer(writers.pop(event.stream.index), event.stream, report, stop)
                gate.open_files = len(writers)
            if not writers and report.frames_written >= report.frames_requested:
                stop.phase = "closing"  # every file is final: only the sessions' close is left
            emit(ProgressEvent("rollout", report.frames_written, report.frames_requested, event,
                               runner.cache.stats().pages_in_use, encode_wait_s))
            if poll and event.ends_forward and _stopped(report, stop):
                return True
        return False

    try:
        stopped = False
        for event in gate.steps(blocks(runner, plan)):
            files.latencies.setdefault(event.stream.index, []).append(event.latency)
            handoff.push(event, copy=writes)
            if deliver(handoff.ready()):
                stopped = True
                break
        if not stopped:
            deliver(handoff.ready(keep=0))
    except BaseException as exc:  # noqa: BLE001 - every failure ends in a report
        record_failure(report, exc)
        _deliver_finished(deliver, handoff)
    finally:
        report.rollout_s = time.perf_counter() - start
        stop.phase = "finalising"  # from here on, only finishing: the files, the runner, stats
        with gate.files():
            _close_writers(files, report, stop)
        stop.phase = "closing"


def _close_writers(files: Files, report: RolloutReport, stop: RolloutStop) -> None:
    """Finalise every file still open (the caller holds the gate's files)."""
    streams = {stream.index: stream for stream in files.plan.streams}
    for index, writer in list(files.writers.items()):
        _close_writer(writer, streams[index], report, stop)
    files.writers.clear()
    files.gate.open_files = 0
    if files.writes:  # what the files hold, not what reached the writers (a full disk, say)
        report.frames_written = sum(output.frames for output in report.outputs)


def _abandon(report: RolloutReport, stop: RolloutStop, files: Files,
             runner: Runner) -> RolloutReport:
    """The files taken over from a job whose thread is stuck in the pipeline's code (by
    `files.gate.take_over`, on another thread): the blocks already on the host written,
    every file finalised, a copy of the report made (the job's thread may still write to
    its own, should the pipeline return). The job's thread never touches the files again."""
    report = copy.copy(report)
    report.warnings, report.outputs = list(report.warnings), list(report.outputs)
    if files.start is not None:
        report.rollout_s = time.perf_counter() - files.start
    if report.status == "ok":
        record_failure(report, KeyboardInterrupt(stop.reason or ""))
    stop.phase = "finalising"
    try:
        for event in files.handoff.finished():
            _write(event, files.writers, files.config, report, files.writes)
    except BaseException:  # noqa: BLE001 - the interrupt is what is reported
        pass
    _close_writers(files, report, stop)
    try:
        _finish_report(report, runner, files)
    except BaseException:  # noqa: BLE001 - e.g. a stuck device's timings: the report stands
        pass
    return report


def _deliver_finished(deliver: Deliver, handoff: FrameHandoff) -> None:
    """After a failure: write the blocks that finished before it (queued on CUDA); an error
    now (the device's, again) leaves the failure already recorded as it is."""
    try:
        deliver(handoff.ready(keep=0), poll=False)
    except BaseException:  # noqa: BLE001 - the first failure is the one reported
        pass


def _write(event: BlockEvent, writers: dict[int, VideoWriter], config: RunConfig,
           report: RolloutReport, writes: bool = True) -> None:
    if not writes:
        report.frames_written += int(event.frames.shape[0])
        return
    writer = writers.get(event.stream.index)
    if writer is None:
        writer = writers[event.stream.index] = _open_writer(event, config)
    writer.write(event.frames)
    report.frames_written += int(event.frames.shape[0])


def _stopped(report: RolloutReport, stop: RolloutStop) -> bool:
    """Poll `stop` at a safe point; a stop with frames still to make is an interrupted run."""
    if report.frames_written >= report.frames_requested:
        return False  # nothing is left to stop: the run is complete
    reason = stop.poll()
    if reason is None:
        return False
    record_interrupt(report, reason)
    return True


def _open_writer(event: BlockEvent, config: RunConfig) -> VideoWriter:
    out = config.output
    return VideoWriter(event.stream.output_path, out.fps, codec=out.codec, crf=out.crf,
                       preset=out.preset, scale=out.scale)


def _close_writer(writer: VideoWriter, stream: Stream, report: RolloutReport,
                  stop: RolloutStop) -> None:
    """Finalize one file; `stop.phase` says `finalising` meanwhile."""
    phase, stop.phase = stop.phase, "finalising"
    info: VideoInfo | None
    try:
        info = writer.close()
    except BaseException as exc:  # noqa: BLE001 - the encoder failing is a failed run
        if report.status == "ok":
            record_failure(report, exc)
        info = writer.info  # a second close() would raise the same error again
        if info is None:  # interrupted before the file was finalized
            return
    finally:
        stop.phase = phase
    prompt = stream.schedule[0].prompt
    report.outputs.append(OutputRecord(info.path, info.codec, info.frames, info.bytes, prompt))


def _close_runner(runner: Runner, report: RolloutReport, gate: FileGate) -> None:
    try:
        with gate.pipeline():  # the close hooks
            runner.close()
    except ArdiffError as exc:
        report.warnings.append(f"closing sessions: {exc}")
    except BaseException as exc:  # noqa: BLE001 - a hook that exits, Ctrl-C: still a report
        if report.status == "ok":
            record_failure(report, exc)


def _finish_report(report: RolloutReport, runner: Runner, files: Files) -> None:
    stats = runner.stats()
    report.block_latencies_s = stats.block_latencies_s
    report.sessions = stats.sessions
    report.batching = batching_record(
        files.batch, files.config.rollout.batch, stats.batch_sizes,
        {index: [seconds(latency) for latency in latencies]
         for index, latencies in files.latencies.items()})
    cache = stats.cache
    report.kv = {"backend": cache.backend, "pages_total": cache.pages_total,
                 "pages_in_use": cache.pages_in_use, "pages_peak": cache.pages_peak,
                 "kv_bytes_allocated": cache.kv_bytes_allocated,
                 "cross_attention_bytes": cache.cross_attention_bytes,
                 "session_capacity": runner.plan.session_capacity,
                 "bytes_per_session": runner.plan.bytes_per_session}
    report.peak_rss_bytes = peak_rss_bytes()
    if runner.device.type == "cuda":
        import torch

        report.peak_device_bytes = int(torch.cuda.max_memory_allocated(runner.device))

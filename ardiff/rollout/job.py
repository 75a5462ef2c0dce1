"""A whole rollout job in one process: check, load, warm up, run, encode, report.

    report = run_rollout(config, on_event=callback, stop=RolloutStop())

Bad input (config, spec, output path, capacity) raises before anything is computed or
created. Once the rollout starts, every failure (the pipeline or encoder raising, a
pipeline calling `sys.exit`, Ctrl-C) ends in the report as `failed` or `interrupted`, the
files finalized with every finished frame. Stopping is cooperative: the job polls `stop`
at safe points (before warmup, before the first block, after each block reaches the
writer), so no file is left half-written; while `stop.phase` is `loading` or `warmup` a
caller may raise KeyboardInterrupt instead. A job of several processes is
`ardiff.launch`'s: each rank runs its `JobShare` through this function. Nothing prints.
"""

from __future__ import annotations

import numbers
import time
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from ardiff.config.run import RunConfig
from ardiff.contract import ARDiffusionPipeline
from ardiff.distributed.context import ParallelContext
from ardiff.engine.build import ResolvedPipeline, build_runner, resolve
from ardiff.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    ArdiffError,
    ConfigError,
    PipelineLoadError,
    WarmupError,
)
from ardiff.rollout.handoff import FrameHandoff, make_handoff
from ardiff.rollout.paths import check_rollout_paths
from ardiff.rollout.progress import ProgressEvent
from ardiff.rollout.report import OutputRecord, RolloutReport, peak_rss_bytes
from ardiff.rollout.share import JobShare
from ardiff.rollout.stop import RolloutStop
from ardiff.rollout.streams import (
    BlockEvent,
    RolloutPlan,
    Stream,
    check_capacity,
    iter_rollout,
    plan_rollout,
)
from ardiff.video.writer import VideoInfo, VideoWriter, check_output_path

if TYPE_CHECKING:  # pragma: no cover - typing only: the runner imports torch
    from ardiff.engine.runner import Runner

BlockSource = Callable[["Runner", RolloutPlan], Iterator[BlockEvent]]  # (runner, plan) -> blocks


class Deliver(Protocol):
    """`_run`'s writer of ready blocks: True when a stop was polled."""

    def __call__(self, ready: Iterator[BlockEvent], poll: bool = True) -> bool: ...


def run_rollout(config: RunConfig, on_event: Callable[[ProgressEvent], None] | None = None,
                stop: RolloutStop | None = None, share: JobShare | None = None,
                blocks: BlockSource = iter_rollout) -> RolloutReport:
    """Run the rollout the config describes; return its report (status ok/failed/interrupted).

    `stop` is polled at safe points (see the module docstring); None: run to the end.
    `share`: this process's part of a parallel job (None: the whole job, which must
    be one process's: `ardiff.launch.run_job` chooses). `blocks` drives the runner (default: the
    plan's blocks; `ardiff.rollout.live` steps one block at a time with actions chosen as
    it goes). Raises ardiff errors only before the rollout starts (bad input, capacity,
    loading).
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
    runner = build_runner(config, resolved, agree_min=share.agree_min)
    try:
        check_capacity(plan, runner.plan.session_capacity)
    except BaseException:
        runner.close()
        raise
    report = _new_report(config, plan, runner)
    try:
        _warm_up_and_run(runner, plan, config, report, emit, stop, blocks, share.writes)
    finally:
        _close_runner(runner, report)
    _finish_report(report, runner)
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
    per_block, first_block = _video_frames_per_block(resolved.pipeline, spec.frames_per_block)
    plan = plan_rollout(config, spec, per_block, first_block)
    check_rollout_paths(config, [stream.output_path for stream in plan.streams])
    out = config.output
    for stream in plan.streams:
        check_output_path(stream.output_path, out.codec, out.crf, out.preset, out.scale)
    return resolved, plan


def _video_frames_per_block(pipeline: ARDiffusionPipeline, latent_frames: int) -> tuple[int, int]:
    """Video frames of a block, and of a session's first block: the decoder makes
    `video_frames_per_latent_frame` (default 1) per latent frame, and
    `video_frames_first_latent_frame` (default: the same) for a session's first one."""
    per = _frames_attribute(pipeline, "video_frames_per_latent_frame", 1,
                            "video frames the decoder makes per latent frame")
    first = _frames_attribute(pipeline, "video_frames_first_latent_frame", per,
                              "video frames the decoder makes for a session's first latent frame")
    return latent_frames * per, first + (latent_frames - 1) * per


def _frames_attribute(pipeline: ARDiffusionPipeline, name: str, default: int,
                      meaning: str) -> int:
    value = getattr(pipeline, name, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PipelineLoadError(f"pipeline: {name} is {value!r}; it must be an integer >= 1 "
                                f"({meaning}), or leave it undefined for {default}")
    return int(value)


def _new_report(config: RunConfig, plan: RolloutPlan, runner: Runner) -> RolloutReport:
    return RolloutReport(pipeline=config.pipeline.entry, device=str(runner.device),
                         dtype=runner.plan.dtype,  # runtime.dtype, auto resolved
                         frames_requested=plan.frames * len(plan.streams),
                         output_fps=config.output.fps)


def _warm_up_and_run(runner: Runner, plan: RolloutPlan, config: RunConfig, report: RolloutReport,
                     emit: Callable[[ProgressEvent], None], stop: RolloutStop,
                     blocks: BlockSource, writes: bool) -> None:
    """Warmup, then the rollout, each only if nothing stopped the job before it."""
    try:
        if config.warmup.enabled and not _stopped(report, stop):
            stop.phase = "warmup"
            emit(ProgressEvent("warmup", 0, report.frames_requested))
            _warmup(runner, report)
        if report.status == "ok" and not _stopped(report, stop):
            _run(runner, plan, config, report, emit, stop, blocks, writes)
    except BaseException as exc:  # noqa: BLE001 - e.g. Ctrl-C between the steps: still a report
        if report.status == "ok":
            _record_failure(report, exc)
    finally:
        stop.phase = "finalising"  # closing the runner and the report: nothing to interrupt


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
         writes: bool) -> None:
    """The blocks, each handed to its stream's writer (`writes` False: counted, not written:
    a CFG group's second rank makes the frames its first rank writes).

    On CUDA frames reach the writer one block late (`ardiff.rollout.handoff`). A stop
    polled after block i drops block i+1's frames, so the files end where a CPU run's
    would; a failure writes every block that finished before it."""
    stop.phase = "rollout"  # before the first file opens: from here a stop must be requested
    writers: dict[int, VideoWriter] = {}
    start = time.perf_counter()
    handoff = make_handoff(runner, getattr(blocks, "frames_lag", None))

    def deliver(ready: Iterator[BlockEvent], poll: bool = True) -> bool:
        """Write the ready blocks; True when a stop was polled (`poll` False: after a
        failure, when a parallel rank's poll would wait for peers that may be gone)."""
        for event in ready:
            _write(event, writers, config, report, writes)
            if report.time_to_first_frame_s is None:
                report.time_to_first_frame_s = time.perf_counter() - start
            if event.frames_written >= plan.frames and event.stream.index in writers:
                _close_writer(writers.pop(event.stream.index), event.stream, report, stop)
            emit(ProgressEvent("rollout", report.frames_written, report.frames_requested, event,
                               runner.cache.stats().pages_in_use))
            if poll and _stopped(report, stop):
                return True
        return False

    try:
        stopped = False
        for event in blocks(runner, plan):
            handoff.push(event, copy=writes)
            if deliver(handoff.ready()):
                stopped = True
                break
        if not stopped:
            deliver(handoff.ready(keep=0))
    except BaseException as exc:  # noqa: BLE001 - every failure ends in a report
        _record_failure(report, exc)
        _deliver_finished(deliver, handoff)
    finally:
        report.rollout_s = time.perf_counter() - start
        stop.phase = "finalising"  # from here on, only finishing: the files, the runner, stats
        streams = {stream.index: stream for stream in plan.streams}
        for index, writer in list(writers.items()):
            _close_writer(writer, streams[index], report, stop)


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
    _record_interrupt(report, reason)
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
            _record_failure(report, exc)
        info = writer.info  # a second close() would raise the same error again
        if info is None:  # interrupted before the file was finalized
            return
    finally:
        stop.phase = phase
    prompt = stream.schedule[0].prompt
    report.outputs.append(OutputRecord(info.path, info.codec, info.frames, info.bytes, prompt))


def _record_failure(report: RolloutReport, exc: BaseException) -> None:
    """What went wrong, as the report says it: KeyboardInterrupt is `interrupted` (by the
    signal named in its message, if any), anything else `failed`; never re-raises."""
    if isinstance(exc, KeyboardInterrupt):
        _record_interrupt(report, str(exc))
        return
    report.status = "failed"
    report.exit_code = exc.exit_code if isinstance(exc, ArdiffError) else EXIT_FAILED
    report.error = _describe(exc)
    report.exception = exc


def _record_interrupt(report: RolloutReport, reason: str) -> None:
    """`interrupted`, or `interrupted by SIGTERM` when there is a reason."""
    by = f" by {reason}" if reason else ""
    report.status, report.exit_code = "interrupted", EXIT_INTERRUPTED
    report.error = f"interrupted{by}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ArdiffError):
        return str(exc)
    if isinstance(exc, SystemExit):  # outside generate_block, e.g. in a hook
        return (f"the pipeline called exit({exc.code!r}); a pipeline must raise an exception, "
                f"not exit the process")
    return f"{type(exc).__name__}: {exc}"


def _close_runner(runner: Runner, report: RolloutReport) -> None:
    try:
        runner.close()
    except ArdiffError as exc:
        report.warnings.append(f"closing sessions: {exc}")
    except BaseException as exc:  # noqa: BLE001 - a hook that exits, Ctrl-C: still a report
        if report.status == "ok":
            _record_failure(report, exc)


def _finish_report(report: RolloutReport, runner: Runner) -> None:
    stats = runner.stats()
    report.block_latencies_s = stats.block_latencies_s
    report.sessions = stats.sessions
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

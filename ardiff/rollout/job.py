"""A whole rollout job: check, load, warm up, run, encode, report (what `ardiff rollout` does).

    report = run_rollout(config, on_event=callback)

Bad input (config, spec, output path, capacity) raises before anything is
computed or created. Once the rollout starts, every failure — an exception in
the pipeline, the encoder, or Ctrl-C — is caught here: the files are
finalized with every finished frame, and the report says `failed` or
`interrupted` with the error. The job never prints; progress leaves through
`on_event`.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass
from typing import Any, Callable

from ardiff.config.run import RunConfig
from ardiff.errors import (EXIT_FAILED, EXIT_INTERRUPTED, ArdiffError, PipelineLoadError,
                           WarmupError)
from ardiff.engine.build import build_runner, resolve
from ardiff.rollout.streams import BlockEvent, RolloutPlan, check_capacity, iter_rollout, plan_rollout
from ardiff.rollout.report import OutputRecord, RolloutReport, peak_rss_bytes


@dataclass(frozen=True)
class ProgressEvent:
    """Progress for a UI: `phase` is `warmup`, `rollout` or `done`."""

    phase: str
    frames_written: int
    frames_total: int
    block: BlockEvent | None = None


def run_rollout(config: RunConfig,
                on_event: Callable[[ProgressEvent], None] | None = None) -> RolloutReport:
    """Run the rollout the config describes; return its report (status ok/failed/interrupted)."""
    from ardiff.video.writer import check_output_path  # imports torch: only when a job runs

    emit = on_event or (lambda event: None)
    resolved = resolve(config)
    spec = resolved.spec
    plan = plan_rollout(config, spec,
                        spec.frames_per_block * _video_frames_per_latent(resolved.pipeline))
    out = config.output
    for stream in plan.streams:
        check_output_path(stream.output_path, out.codec, out.crf, out.preset)
    runner = build_runner(config, resolved)
    try:
        check_capacity(plan, runner.plan.session_capacity)
        report = _new_report(config, plan, runner)
        if config.warmup.enabled:
            emit(ProgressEvent("warmup", 0, report.frames_requested))
            _warmup(runner, report)
        if report.status == "ok":  # not interrupted during warmup
            _run(runner, plan, config, report, emit)
    finally:
        close_errors = _close_runner(runner)
    report.warnings.extend(close_errors)
    _finish_report(report, runner)
    emit(ProgressEvent("done", report.frames_written, report.frames_requested))
    return report


def _video_frames_per_latent(pipeline: Any) -> int:
    value = getattr(pipeline, "video_frames_per_latent_frame", 1)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PipelineLoadError(f"pipeline: video_frames_per_latent_frame is {value!r}; it must "
                                f"be an integer >= 1 (video frames the decoder makes per latent "
                                f"frame), or leave it undefined for 1")
    return int(value)


def _new_report(config: RunConfig, plan: RolloutPlan, runner: Any) -> RolloutReport:
    return RolloutReport(pipeline=config.pipeline.entry, device=str(runner.device),
                         dtype=config.runtime.dtype,
                         frames_requested=plan.frames * len(plan.streams),
                         output_fps=config.output.fps)


def _warmup(runner: Any, report: RolloutReport) -> None:
    try:
        warmup = runner.warmup()
    except WarmupError as exc:
        report.warnings.append(f"{exc}; continuing without warmup")
        return
    except KeyboardInterrupt as exc:
        _record_failure(report, exc)
        return
    report.warmup_s = warmup.total_s
    if warmup.skipped_reason:
        report.warnings.append(f"warmup skipped: {warmup.skipped_reason}")
    if warmup.leaked_pages:
        report.warnings.append(f"warmup leaked {warmup.leaked_pages} KV pages")


def _run(runner: Any, plan: RolloutPlan, config: RunConfig, report: RolloutReport,
         emit: Callable[[ProgressEvent], None]) -> None:
    from ardiff.video.writer import VideoWriter

    writers: dict[int, VideoWriter] = {}
    start = time.perf_counter()
    try:
        for event in iter_rollout(runner, plan):
            writer = writers.get(event.stream.index)
            if writer is None:
                writer = writers[event.stream.index] = _open_writer(event, config)
            writer.write(event.frames)
            report.frames_written += int(event.frames.shape[0])
            if report.time_to_first_frame_s is None:
                report.time_to_first_frame_s = time.perf_counter() - start
            if event.frames_written >= plan.frames:
                _close_writer(writers.pop(event.stream.index), event.stream, report)
            emit(ProgressEvent("rollout", report.frames_written, report.frames_requested, event))
    except BaseException as exc:  # noqa: BLE001 - every failure ends in a report
        _record_failure(report, exc)
    finally:
        report.rollout_s = time.perf_counter() - start
        for index, writer in list(writers.items()):
            _close_writer(writer, plan.streams[index], report)


def _open_writer(event: BlockEvent, config: RunConfig):
    from ardiff.video.writer import VideoWriter

    out = config.output
    return VideoWriter(event.stream.output_path, out.fps, codec=out.codec, crf=out.crf,
                       preset=out.preset)


def _close_writer(writer: Any, stream: Any, report: RolloutReport) -> None:
    try:
        info = writer.close()
    except BaseException as exc:  # noqa: BLE001 - the encoder failing is a failed run
        if report.status == "ok":
            _record_failure(report, exc)
        info = writer.info  # a second close() would raise the same error again
        if info is None:  # interrupted before the file was finalized
            return
    prompt = stream.schedule[0].prompt
    report.outputs.append(OutputRecord(info.path, info.codec, info.frames, info.bytes, prompt))


def _record_failure(report: RolloutReport, exc: BaseException) -> None:
    if isinstance(exc, KeyboardInterrupt):
        report.status, report.exit_code, report.error = "interrupted", EXIT_INTERRUPTED, "interrupted"
        return
    if not isinstance(exc, Exception):
        raise exc  # SystemExit and friends are not ours to swallow
    report.status = "failed"
    report.exit_code = exc.exit_code if isinstance(exc, ArdiffError) else EXIT_FAILED
    report.error = str(exc) if isinstance(exc, ArdiffError) else f"{type(exc).__name__}: {exc}"
    report.exception = exc


def _close_runner(runner: Any) -> list[str]:
    try:
        runner.close()
    except ArdiffError as exc:
        return [f"closing sessions: {exc}"]
    return []


def _finish_report(report: RolloutReport, runner: Any) -> None:
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

"""`ardiff rollout [CONFIG]`: run a model autoregressively and stream its video to a file."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

from ardiff.errors import EXIT_FAILED
from ardiff.video.formats import output_choices
from ardiff_cli import options, picture, signals
from ardiff_cli.errors import handle_errors


def _absolute(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path.expanduser().resolve())


def _check_json_path(json_path: Optional[str], config: Optional[Path], run_config) -> None:
    """Before any work: the stats file is writable (or the stats would be lost after the
    run), and no file is both written and read (`--json`, outputs, the config, inputs)."""
    from ardiff.rollout.paths import check_rollout_paths

    check_rollout_paths(run_config, config_file=config, stats_file=json_path)


def rollout_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    output: str = typer.Option(None, "--output", "-o",
                               help=f"Output video: {output_choices()}."),
    frames: int = typer.Option(None, "--frames", help="Video frames to write (per prompt)."),
    seed: int = typer.Option(None, "--seed", help="Noise seed."),
    prompt: str = typer.Option(None, "--prompt", help="The prompt."),
    prompts: Path = typer.Option(None, "--prompts", help="File with one prompt per line: one "
                                 "video each."),
    actions: Path = typer.Option(None, "--actions", help="YAML list of per-block actions."),
    fps: float = typer.Option(None, "--fps", help="Playback frame rate of the output."),
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    budget: str = options.BudgetOpt,
    workers: int = options.WorkersOpt,
    cfg_parallel: int = options.CfgParallelOpt,
    overrides: options.OverrideList = options.SetOpt,
    json_path: str = typer.Option(None, "--json", metavar="PATH",
                                  help="Write the stats as JSON to PATH ('-': stdout)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no summary."),
    show_frames: bool = typer.Option(False, "--preview", help="Draw the newest frame in the "
                                     "terminal as it runs (needs a terminal on stderr)."),
    report_path: Path = typer.Option(None, "--report", metavar="PATH", help="Draw latency, "
                                     "KV pages, RSS and frames of the run: .png .svg .html."),
    debug: bool = options.DebugOpt,
) -> None:
    """Generate a video block by block over the paged KV cache (no CONFIG: the embedded default).

    SIGINT, SIGTERM and SIGHUP stop it (ardiff_cli.signals): while loading or warming up at
    once, during the rollout after the block in flight. The videos are finalised with every
    finished frame and the stats written (`interrupted by SIGTERM`), exit 130; a further
    signal waits for that.
    """
    with signals.StopSignals() as stop_signals:
        with handle_errors(debug):
            from ardiff.launch.job import run_job  # imports the runtime
            from ardiff.rollout.stop import RolloutStop
            from ardiff_cli import preview  # numpy: only when a command runs
            from ardiff_cli import progress  # rich: only when the command runs

            run_config = options.load_run_config(config, overrides, {
                "output.path": output, "rollout.frames": frames, "rollout.seed": seed,
                "rollout.prompt": prompt, "rollout.prompts": _absolute(prompts),
                "rollout.actions": _absolute(actions), "output.fps": fps,
                "runtime.device": device, "runtime.dtype": dtype,
                "runtime.memory_budget": budget, "runtime.parallel.workers": workers,
                "runtime.parallel.cfg": cfg_parallel})
            _check_json_path(json_path, config, run_config)
            drawing = picture.RunPicture(report_path, "--report")
            stop = RolloutStop()
            stop_signals.follow(stop)
            show = progress.wants_progress(no_progress or quiet)
            frames_on = preview.wants_preview(show_frames, quiet, json_path)
            with preview.rollout_display(show, frames_on, run_config.output.fps) as bar:
                report = run_job(run_config, on_event=drawing.follow(bar.update), stop=stop)
        stop_signals.hold()  # the stats and the summary are written whatever comes now
        if stop_signals.received and report.status == "ok":
            print(f"{stop_signals.received} came too late to stop anything: the run completed",
                  file=sys.stderr)
        _finish(report, json_path, quiet, debug, drawing.write(report))


def _finish(report, json_path: Optional[str], quiet: bool, debug: bool,
            picture_error: Optional[str] = None) -> None:
    """Print and write what the run left; exit with its code (1 if only the stats or the
    picture failed). A torchrun rank other than 0 writes nothing: rank 0 reports the job."""
    if not report.is_primary:
        if report.status != "ok":
            print(f"error: {' '.join((report.error or report.status).split())}", file=sys.stderr)
        raise typer.Exit(report.exit_code)
    json_error = _emit(report, json_path, quiet) or picture_error
    if report.status != "ok":
        if json_error:
            print(f"warning: {json_error}", file=sys.stderr)
        if debug and report.exception is not None:
            traceback.print_exception(report.exception)
        print(f"error: {' '.join((report.error or report.status).split())}", file=sys.stderr)
        raise typer.Exit(report.exit_code)
    if json_error:  # the run went well but a script would miss its stats
        print(f"error: {json_error}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)


def _emit(report, json_path: Optional[str], quiet: bool) -> Optional[str]:
    """Warnings, the JSON and the summary; returns why the JSON file could not be written."""
    data = report.to_dict()
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    json_error = None
    if json_path == "-":
        print(json.dumps(data, indent=2))
    elif json_path:
        json_error = options.write_json_file(json_path, data, kept="the video is kept; ")
    if not quiet:
        from ardiff_cli import render

        render.print_rollout(data, to_stderr=json_path == "-")
    return json_error


"""`ardiff rollout [CONFIG]`: run a model autoregressively and stream its video to a file."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

from ardiff.errors import EXIT_FAILED, ConfigError
from ardiff_cli import options, progress, render
from ardiff_cli.errors import handle_errors


def _absolute(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path.expanduser().resolve())


def _check_json_path(json_path: Optional[str]) -> None:
    """The stats file must be writable before the run, or the stats would be lost after it."""
    if json_path in (None, "-"):
        return
    path = Path(json_path).expanduser()
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--json: {json_path!r} is in a folder that does not exist "
                          f"({str(folder)!r}); create it first or pick another path")
    if path.is_dir():
        raise ConfigError(f"--json: {json_path!r} is a folder; give a file name like "
                          f"{str(path / 'stats.json')!r}")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise ConfigError(f"--json: {json_path!r} is not writable; fix the permissions of the "
                          f"file or of its folder {str(folder)!r}, or pick another path")


def rollout_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    output: str = typer.Option(None, "--output", "-o", help="Output video: .mp4 .mkv .webm "
                               ".gif .webp .npy or a directory (PNG frames)."),
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
    overrides: options.OverrideList = options.SetOpt,
    json_path: str = typer.Option(None, "--json", metavar="PATH",
                                  help="Write the stats as JSON to PATH ('-': stdout)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no summary."),
    debug: bool = options.DebugOpt,
) -> None:
    """Generate a video block by block over the paged KV cache (no CONFIG: the embedded default)."""
    from ardiff.rollout.job import run_rollout  # imports the runtime only when a rollout runs

    with handle_errors(debug):
        _check_json_path(json_path)
        run_config = options.load_run_config(config, overrides, {
            "output.path": output, "rollout.frames": frames, "rollout.seed": seed,
            "rollout.prompt": prompt, "rollout.prompts": _absolute(prompts),
            "rollout.actions": _absolute(actions), "output.fps": fps, "runtime.device": device,
            "runtime.dtype": dtype, "runtime.memory_budget": budget})
        show = progress.wants_progress(no_progress or quiet)
        with progress.RolloutProgress(enabled=show) as bar:
            report = run_rollout(run_config, on_event=bar.update)
    json_error = _emit(report, json_path, quiet)
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
        json_error = _write_json(Path(json_path).expanduser(), data)
    if not quiet:
        render.print_rollout(data, to_stderr=json_path == "-")
    return json_error


def _write_json(path: Path, data: dict) -> Optional[str]:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:  # e.g. the disk filled up during the run
        return (f"--json: cannot write {str(path)!r} ({type(exc).__name__}: {exc}); the video "
                f"is kept; check free disk space and permissions")
    return None

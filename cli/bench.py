"""`ardiff bench CONFIG`: paged vs dense, side by side, with the targets printed beside the numbers."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import typer

from ardiff.errors import EXIT_FAILED
from ardiff_cli import bench_preview, options, picture, render, signals
from ardiff_cli.errors import handle_errors


def _parse_sweep(value: str | None) -> list[int]:
    if not value:
        return []
    try:
        frames = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        frames = []
    if not frames or min(frames) <= 0:
        raise typer.BadParameter(f"{value!r}: give positive frame counts like 100,1000",
                                 param_hint="--sweep-frames")
    return frames


def startup_seconds(args: list[str], runs: int = 3) -> float | None:
    """Median wall time of `ardiff ARGS` in a fresh process (what a shell script pays);
    None when no installed `ardiff` script is found."""
    beside = Path(sys.executable).parent / "ardiff"
    exe = str(beside) if beside.exists() else shutil.which("ardiff")
    if exe is None:
        return None
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([exe, *args], capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_command(
    config: Path = options.ConfigArg,
    blocks: int = typer.Option(4, "--blocks", min=1, help="Timed blocks per repeat and backend."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Alternating repeats (A B A B ...)."),
    sweep_frames: str = typer.Option(None, "--sweep-frames", metavar="N,N,...",
                                     help="Rollout lengths for the pages/RSS sweep, e.g. 100,1000."),
    no_encode: bool = typer.Option(False, "--no-encode", help="Skip the encode-overhead runs "
                                   "(at least 32 blocks per arm: long on big geometries)."),
    workers: int = typer.Option(None, "--workers", min=2, metavar="N",
                                help="Instead: the job on 1 worker against N (ardiff.parallel)."),
    overrides: options.OverrideList = options.SetOpt,
    json_path: str = typer.Option(None, "--json", metavar="PATH",
                                  help="Write the numbers as JSON to PATH ('-': stdout)."),
    preview: bool = typer.Option(False, "--preview", help="Also time the rollout with and "
                                 "without the live preview (target: <= 5% slower)."),
    plot: Path = typer.Option(None, "--plot", metavar="PATH", help="Also draw one rollout: "
                              "latency, KV pages, RSS, frames (.png .svg .html)."),
    debug: bool = options.DebugOpt,
) -> None:
    """Measure the paged KV runtime against the dense reference on one pipeline.

    `--json PATH` is checked before anything runs. SIGINT, SIGTERM and SIGHUP stop the
    measurements at once (no numbers are written): exit 130.
    """
    sweep = _parse_sweep(sweep_frames)
    with signals.StopSignals() as stop_signals:
        with handle_errors(debug):
            options.check_json_path(json_path, config)
            drawing = picture.RunPicture(plot, "--plot")
            from ardiff.bench import run_bench  # imports torch
            from ardiff.config.run import load_config

            run_config = load_config(config, list(overrides or []))
            if workers is not None:
                from ardiff_cli import speedup

                return speedup.run(run_config, workers, repeats, json_path)
            say = lambda msg: print(f"bench: {msg}", file=sys.stderr)  # noqa: E731
            report = run_bench(run_config, blocks, repeats, sweep, encode=not no_encode,
                               on_progress=say)
            data = report.to_dict()
            data.update(bench_preview.run_extras(run_config, repeats, preview, drawing, say))
            data["startup_s"] = {"help": startup_seconds(["--help"]),
                                 "inspect_spec": startup_seconds(["inspect-spec", str(config)])}
        stop_signals.hold()  # the numbers are written whatever comes now
        _emit(data, json_path)


def _emit(data: dict, json_path: str | None) -> None:
    """The JSON (stdout or a file) and the table; exit 1 when the file cannot be written."""
    if json_path == "-":
        print(json.dumps(data, indent=2))
        return
    json_error = options.write_json_file(json_path, data) if json_path else None
    render.print_bench(data)
    bench_preview.print_extras(data)
    if json_error:
        print(f"error: {json_error}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)

"""`ardiff bench CONFIG`: the arms side by side, paired per block, with targets beside the numbers
(`--workers N`: ardiff_cli._speedup; `--batch B,B,...`: ardiff.bench.batch)."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import typer

from ardiff.errors import EXIT_FAILED
from ardiff_cli import _options as options
from ardiff_cli import _picture as picture
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors
from ardiff_cli._stdout import json_stdout

STARTUP_RUNS = 5


def _parse_sweep(value: str | None) -> list[int]:
    """The lengths of `--sweep-frames`; their range is checked with the other counts
    (`ardiff.bench.lengths`)."""
    return _parse_list(value, "--sweep-frames", "positive frame counts like 100,1000")


def _parse_list(value: str | None, flag: str, like: str) -> list[int]:
    if not value:
        return []
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        numbers = []
    if not numbers:
        raise typer.BadParameter(f"{value!r}: give {like}", param_hint=flag)
    return numbers


def _batch_conflict(workers: int | None, sweep: list[int], preview: bool,
                    plot: Path | None) -> str | None:
    """The first option given beside `--batch` that measures something else."""
    given = (("--workers", workers is not None), ("--sweep-frames", bool(sweep)),
             ("--preview", preview), ("--plot", plot is not None))
    return next((flag for flag, on in given if on), None)


def startup_seconds(args: list[str], runs: int = STARTUP_RUNS) -> dict[str, list[float]] | None:
    """Wall times of `ardiff ARGS` in fresh processes (what a shell script pays) and the CPU
    time (user + system) each one used, which machine load moves less; None when no
    installed `ardiff` script is found."""
    beside = Path(sys.executable).parent / "ardiff"
    exe = str(beside) if beside.exists() else shutil.which("ardiff")
    if exe is None:
        return None
    times: dict[str, list[float]] = {"wall": [], "cpu": []}
    for _ in range(runs):
        cpu, start = _children_cpu_s(), time.perf_counter()
        subprocess.run([exe, *args], capture_output=True, check=False)
        times["wall"].append(time.perf_counter() - start)
        times["cpu"].append(_children_cpu_s() - cpu)
    return times


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_command(
    config: Path = options.OptionalConfigArg,
    blocks: int = typer.Option(8, "--blocks", help="Timed blocks per repeat and arm."),
    repeats: int = typer.Option(3, "--repeats",
                                help="Repeats, each on fresh sessions with a filled window."),
    sweep_frames: str = typer.Option(None, "--sweep-frames", metavar="N,N,...",
                                     help="Rollout lengths for the pages/RSS sweep, e.g. 100,1000."),
    no_encode: bool = typer.Option(False, "--no-encode", help="Skip the encode-share runs "
                                   "(at least 32 blocks per repeat: long on big geometries)."),
    no_compile: bool = typer.Option(False, "--no-compile",
                                    help="Skip the compiled arm (torch.compile of the layers)."),
    threads: int = typer.Option(1, "--threads", help="Torch intra-op threads."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the table as Markdown."),
    workers: int = typer.Option(None, "--workers", min=2, metavar="N",
                                help="Instead: the same job on 1 worker and on N worker processes."),
    batch: str = typer.Option(None, "--batch", metavar="B,B,...",
                              help="Instead: B sessions per forward for each B, e.g. 1,2,4,8 "
                                   "(B=1 is the baseline)."),
    overrides: options.OverrideList = options.SetOpt,
    json_path: str = typer.Option(None, "--json", metavar="PATH",
                                  help="Write the numbers as JSON to PATH ('-': stdout)."),
    preview: bool = typer.Option(False, "--preview", help="Also time the rollout with and "
                                 "without the live preview."),
    plot: Path = typer.Option(None, "--plot", metavar="PATH", help="Also draw one rollout: "
                              "latency, KV pages, RSS, frames (.png .svg .html)."),
    debug: bool = options.DebugOpt,
) -> None:
    """Measure ardiff side by side: paged vs dense, vs a hand-written loop, eager vs compiled
    (no CONFIG: the embedded default); or, with `--batch 1,2,4,8`, B sessions per forward.

    The arms alternate block by block; ratios are paired per block (median, p10-p90), with
    the model thread's CPU time beside wall time. `--json PATH`, the counts and the
    lengths (within the pipeline's max_model_len) are checked before anything runs; with
    `--json -` stdout holds the JSON alone. Ctrl-C, SIGTERM and SIGHUP stop the
    measurements at once (no numbers are written): exit 130. A `--plot` that cannot be
    written is exit 1, after the numbers.
    """
    sweep = _parse_sweep(sweep_frames)
    sizes = _parse_list(batch, "--batch", "positive batch sizes like 1,2,4,8")
    with signals.StopSignals() as stop_signals, json_stdout(json_path == "-") as json_out:
        with handle_errors(debug):
            from ardiff.bench.lengths import check_batch_sizes, check_counts
            from ardiff.errors import ConfigError

            check_counts(blocks, repeats, threads, sweep)
            if sizes:
                check_batch_sizes(sizes)
                conflict = _batch_conflict(workers, sweep, preview, plot)
                if conflict:
                    raise ConfigError(f"--batch: cannot be combined with {conflict}; it "
                                      f"measures batch sizes alone: run {conflict} as another "
                                      f"bench")
            options.check_json_path(json_path, config)
            drawing = picture.RunPicture(plot, "--plot")
            from ardiff.bench import run_bench  # imports torch
            from ardiff.bench.spread import Spread
            from ardiff.config.run import load_config
            from ardiff_cli import _bench_preview as bench_preview

            run_config = load_config(config, [*(overrides or []), *options.flag_overrides(
                **{"runtime.parallel.workers": workers})])
            options.check_command_paths(run_config, config, json_path, [("--plot", plot)],
                                        videos=False)
            if workers is not None:
                from ardiff_cli import _speedup as speedup

                return speedup.run(run_config, workers, repeats, json_path, json_out)
            if sizes:
                from ardiff.bench.batch import run_batch_bench

                data = run_batch_bench(run_config, sizes, blocks, repeats, threads,
                                       on_progress=_say).to_dict()
            else:
                if preview or drawing.path is not None:
                    bench_preview.check_rollout(run_config)
                report = run_bench(run_config, blocks, repeats, sweep, encode=not no_encode,
                                   compiled=not no_compile, threads=threads,
                                   on_progress=_say)
                data = report.to_dict()
                data.update(bench_preview.run_extras(run_config, repeats, preview, drawing,
                                                     _say))
                print("bench: start-up", file=sys.stderr)
                spec_path = _config_file(config)
                data["startup_s"] = {
                    name: None if times is None else {kind: Spread.of(values).to_dict()
                                                      for kind, values in times.items()}
                    for name, times in (("help", startup_seconds(["--help"])),
                                        ("inspect_spec", spec_path and startup_seconds(
                                            ["inspect-spec", spec_path])))}
        stop_signals.hold()  # the numbers are written whatever comes now
        _emit(data, json_path, str(config or "(the embedded default)"), markdown, json_out)


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr)


def _config_file(config: Path | None) -> str | None:
    """The config's file, for timing `inspect-spec` on it; the embedded default's when it is
    a file on disk (not inside a zip)."""
    if config is not None:
        return str(config)
    from importlib import resources

    from ardiff.config.run import DEFAULT_CONFIG_NAME

    path = resources.files("ardiff.configs").joinpath(DEFAULT_CONFIG_NAME)
    return str(path) if isinstance(path, Path) and path.is_file() else None


def _emit(data: dict, json_path: str | None, config: str, markdown: bool, json_out) -> None:
    """The JSON (stdout, `json_out`, or a file) and the table; exit 1 when the file or the
    `--plot` picture cannot be written (as `ardiff rollout --report`)."""
    from ardiff_cli import _bench_preview as bench_preview
    from ardiff_cli import _bench_table as bench_table

    plot_error = (data.get("plot") or {}).get("error")
    if json_path == "-":
        print(json.dumps(data, indent=2), file=json_out)
        json_error = None
    else:
        json_error = options.write_json_file(json_path, data) if json_path else None
        if markdown:
            print(bench_table.markdown(data, config))
        else:
            bench_table.print_bench(data, config)
        if data.get("mode") != "batch":
            bench_preview.print_extras(data)
    for error in (json_error, plot_error):
        if error:
            print(f"error: {error}", file=sys.stderr)
    if json_error or plot_error:
        raise typer.Exit(EXIT_FAILED)

"""`ardiff rollout [CONFIG]`: run a model autoregressively and stream its video to a file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ardiff.video.formats import output_choices
from ardiff_cli import _options as options
from ardiff_cli import _picture as picture
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors
from ardiff_cli._help import FROM_CONFIG
from ardiff_cli._run_report import finish_run
from ardiff_cli._stdout import json_stdout
from ardiff_cli._timeline import Timeline


def _absolute(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path.expanduser().resolve())


def rollout_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    output: str = typer.Option(None, "--output", "-o", show_default=FROM_CONFIG,
                               help=f"Output video: {output_choices()}."),
    frames: int = typer.Option(None, "--frames", show_default=FROM_CONFIG, help="Video frames to write (per prompt)."),
    seed: int = typer.Option(None, "--seed", show_default=FROM_CONFIG, help="Noise seed."),
    prompt: str = typer.Option(None, "--prompt", show_default=FROM_CONFIG, help="The prompt."),
    prompts: Path = typer.Option(None, "--prompts", show_default=FROM_CONFIG, help="File with one prompt per line: one "
                                 "video each."),
    actions: Path = typer.Option(None, "--actions", show_default=FROM_CONFIG, help="YAML list of per-block actions."),
    fps: float = typer.Option(None, "--fps", show_default=FROM_CONFIG, help="Playback frame rate of the output."),
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    budget: str = options.BudgetOpt,
    workers: int = options.WorkersOpt,
    cfg_parallel: int = options.CfgParallelOpt,
    batch: str = options.BatchOpt,
    overrides: options.OverrideList = options.SetOpt,
    json_path: str = typer.Option(None, "--json", metavar="PATH",
                                  help="Write the stats as JSON to PATH ('-': stdout)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress and no summary."),
    show_frames: bool = typer.Option(False, "--preview", help="Draw the newest frame in the "
                                     "terminal as it runs (needs a terminal on stderr)."),
    report_path: Path = typer.Option(None, "--report", metavar="PATH", help="Draw latency, "
                                     "KV pages, RSS and frames of the run: .png .svg .html."),
    timeline_path: Path = typer.Option(None, "--timeline", metavar="PATH", help="Write one "
                                       "JSON line per block (start, end, denoise, commit, "
                                       "decode and encode-wait seconds, KV pages) to PATH; "
                                       "--json then lists them as blocks."),
    debug: bool = options.DebugOpt,
) -> None:
    """Generate a video block by block over the paged KV cache (no CONFIG: the embedded default).

    Ctrl-C, SIGTERM and SIGHUP stop it: at once while loading or warming up, after the block
    in flight during the rollout. The videos are finalised with every finished frame and the
    stats written (`interrupted by SIGTERM`), exit 130; a second signal waits for that, but
    abandons a block the pipeline is stuck in. With `--json -` stdout holds the JSON alone:
    what the pipeline prints goes to stderr.
    """
    with signals.StopSignals() as stop_signals, json_stdout(json_path == "-") as json_out:
        with handle_errors(debug):
            from ardiff.launch.job import run_job  # imports the runtime
            from ardiff.rollout.stop import RolloutStop
            from ardiff_cli import _preview as preview  # numpy: only when a command runs
            from ardiff_cli import _progress as progress  # rich: only when the command runs

            run_config = options.load_run_config(config, overrides, {
                "output.path": output, "rollout.frames": frames, "rollout.seed": seed,
                "rollout.prompt": prompt, "rollout.prompts": _absolute(prompts),
                "rollout.actions": _absolute(actions), "output.fps": fps,
                "runtime.device": device, "runtime.dtype": dtype,
                "runtime.memory_budget": budget, "runtime.parallel.workers": workers,
                "runtime.parallel.cfg": cfg_parallel,
                "rollout.batch": options.batch_value(batch)})
            drawing = picture.RunPicture(report_path, "--report")
            options.check_command_paths(run_config, config, json_path,
                                        [("--report", report_path),
                                         ("--timeline", timeline_path)])
            timeline = Timeline(timeline_path)
            stop = RolloutStop()
            stop_signals.follow(stop)
            show = progress.wants_progress(no_progress or quiet)
            frames_on = preview.wants_preview(show_frames, quiet, json_path)
            with preview.rollout_display(show, frames_on, run_config.output.fps) as bar:
                stop_signals.when_stuck(bar, lambda stuck: finish_run(  # ardiff_cli._signals
                    stuck, json_path, quiet, debug, drawing.write(stuck), json_out, timeline))
                report = run_job(run_config, on_event=timeline.follow(
                    drawing.follow(bar.update)), stop=stop)
        stop_signals.hold()  # the stats and the summary are written whatever comes now
        if stop_signals.received and report.status == "ok":
            print(f"{stop_signals.received} came too late to stop anything: the run completed",
                  file=sys.stderr)
        finish_run(report, json_path, quiet, debug, drawing.write(report), json_out, timeline)


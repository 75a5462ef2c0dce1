"""What `ardiff bench --preview` and `--plot PATH` add to the bench's numbers.

`--preview`: the config's rollout run whole (`run_rollout`, its video in a temporary
folder) without and with the live preview, alternating, `--repeats` times; the rollout's
own time (`rollout_s`) and the time spent in callbacks are set against PREVIEW_TARGET.
Both draw into a terminal-sized truecolor console writing to /dev/null: ardiff's own cost,
not the terminal emulator's.

`--plot PATH`: one more rollout, recorded block by block and drawn as `ardiff rollout
--report` draws it (ardiff.rollout.figure).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ardiff_cli import _picture as picture

PREVIEW_TARGET = 0.05          # the preview may cost at most 5% of the rollout's time
OFFSCREEN_SIZE = (100, 40)      # columns, rows of the console the measured preview draws in


def run_extras(run_config: Any, repeats: int, measure_preview: bool,
               drawing: picture.RunPicture, say: Callable[[str], None]) -> dict[str, Any]:
    """The `preview` numbers and/or the picture; returns what goes into the bench JSON."""
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if measure_preview:
            data["preview"] = _measure_preview(run_config, repeats, Path(tmp), say)
        if drawing.path is not None:
            say(f"plot: recording one rollout for {drawing.path}")
            report = _rollout(run_config, Path(tmp) / "plot", drawing.follow(lambda e: None))
            error = drawing.write(report)
            data["plot"] = {"path": str(drawing.path), "error": error}
    return data


def _measure_preview(run_config: Any, repeats: int, tmp: Path,
                     say: Callable[[str], None]) -> dict[str, Any]:
    """Both arms' rollout time, and the time spent in their callbacks: the preview draws
    synchronously in its callback (no thread), so the callbacks' difference over the
    rollout's time is its cost even on a machine too noisy for the wall-clock ratio."""
    times: dict[str, list[float]] = {"without": [], "with": []}
    callbacks = {"without": 0.0, "with": 0.0}
    frames_drawn = 0
    with open(os.devnull, "w") as sink:
        for rep in range(repeats):
            for arm in times:
                say(f"preview {rep + 1}/{repeats}: {arm}")
                with _offscreen_display(run_config.output.fps, sink, arm == "with") as display:
                    timed = _Timed(display.update)
                    report = _rollout(run_config, tmp / f"{arm}-{rep}", timed)
                callbacks[arm] += timed.seconds
                frames_drawn += getattr(display, "frames_drawn", 0)
                times[arm].append(report.rollout_s)
    with_s, without_s = sum(times["with"]), sum(times["without"])
    return {"with_s": with_s, "without_s": without_s,
            "overhead": with_s / without_s - 1 if without_s else None,
            "callback_s": callbacks,
            "callback_overhead": ((callbacks["with"] - callbacks["without"]) / without_s
                                  if without_s else None),
            "frames_drawn": frames_drawn, "target": PREVIEW_TARGET}


class _Timed:
    """A callback that adds up the seconds spent in it."""

    def __init__(self, call: Callable[[Any], None]) -> None:
        self.call, self.seconds = call, 0.0

    def __call__(self, event: Any) -> None:
        start = time.perf_counter()
        self.call(event)
        self.seconds += time.perf_counter() - start


def _offscreen_display(fps: float, sink, frames: bool) -> Any:
    """What `ardiff rollout` shows in a terminal, with `--preview` (`frames`) or without
    (the progress bar alone), drawn into a terminal-sized console writing to `sink`."""
    from rich.console import Console

    from ardiff_cli import _preview as preview
    from ardiff_cli._progress import RolloutProgress

    cols, rows = OFFSCREEN_SIZE
    console = Console(file=sink, force_terminal=True, color_system="truecolor", width=cols,
                      height=rows)
    if frames:
        return preview.RolloutPreview(fps, console=console)
    return RolloutProgress(enabled=True, console=console)


def _rollout(run_config: Any, stem: Path, on_event) -> Any:
    """The config's rollout with its video under `stem` (same format); the report."""
    from ardiff.rollout.job import run_rollout

    report = run_rollout(_writing_to(run_config, stem), on_event=on_event)
    if report.status != "ok":
        from ardiff.errors import RunError

        raise RunError(f"bench: the rollout for the preview/plot failed: {report.error}")
    return report


def check_rollout(run_config: Any) -> None:
    """The rollout `--preview` and `--plot` run, checked as `ardiff rollout` checks it
    (lengths, prompts, actions; no file is made) before the bench starts: exit 2."""
    from ardiff.rollout.job import prepare_rollout

    prepare_rollout(_writing_to(run_config, Path(tempfile.gettempdir()) / "ardiff-bench"))


def _writing_to(run_config: Any, stem: Path) -> Any:
    """The config with its video under `stem` (same format)."""
    from ardiff.config.run import with_base_dir

    suffix = Path(run_config.output.path).suffix
    output = dataclasses.replace(run_config.output, path=str(stem) + suffix)
    return with_base_dir(dataclasses.replace(run_config, output=output), run_config.base_dir)


def print_extras(data: dict[str, Any]) -> None:
    """One line per extra, the target beside the number."""
    from ardiff_cli._render import console

    numbers = data.get("preview")
    if numbers is not None and numbers["overhead"] is not None:
        console.print(f"preview overhead: {numbers['callback_overhead'] * 100:+.1f}% of the "
                      f"rollout's time spent drawing ({numbers['frames_drawn']} frames drawn); "
                      f"wall clock {numbers['overhead'] * 100:+.1f}% ({numbers['with_s']:.2f} s "
                      f"with, {numbers['without_s']:.2f} s without); target <= "
                      f"{numbers['target'] * 100:.0f}%")
    plot = data.get("plot")
    if plot is not None:
        console.print(f"plot: {plot['path']}" if plot["error"] is None
                      else f"plot: not written: {plot['error']}")

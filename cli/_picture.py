"""`--report PATH` (rollout) and `--plot PATH` (bench): a picture of a run, drawn after it.

The path and matplotlib are checked before any work (exit 2 with the install command
when matplotlib is missing; the command checks the path against its other paths,
ardiff.rollout.paths); the timeline is recorded from the job's progress events;
the picture is written when the run has ended, whatever its status (a failed run's
blocks are worth seeing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from ardiff_cli import _options as options


class RunPicture:
    """Records a run for `path` (None: records nothing and writes nothing)."""

    def __init__(self, path: Optional[Path], flag: str) -> None:
        self.path, self.flag = None, flag
        if path is not None:
            from ardiff.rollout.figure import check_figure_path
            from ardiff.rollout.timeline import RunTimeline

            self.path = check_figure_path(path, flag)
            self.timeline = RunTimeline()

    def follow(self, on_event: Callable[[Any], None]) -> Callable[[Any], None]:
        """`on_event`, also recording the timeline when there is a picture to draw."""
        if self.path is None:
            return on_event

        def both(event: Any) -> None:
            self.timeline.record(event)
            on_event(event)

        return both

    def write(self, report: Any) -> Optional[str]:
        """Draw the picture of `report`'s run; returns why it could not be written."""
        if self.path is None:
            return None
        from ardiff.rollout.figure import write_figure

        data = report.to_dict()
        return options.write_output_file(
            self.flag, self.path, "the picture",
            lambda path: write_figure(self.timeline, path, title(data), summary(data)))


def title(data: dict) -> str:
    """`pipeline · N frames · X fps (Y× real time)` from a rollout's JSON."""
    timing = data["timing"]
    speed = ""
    if timing["frames_per_s"] is not None:
        speed = f" · {timing['frames_per_s']:.1f} frames/s"
        if timing["real_time_factor"] is not None:
            speed += f" ({timing['real_time_factor']:.2f}× real time)"
    return f"{data['run']['pipeline']} · {data['frames']['written']} frames{speed}"


def summary(data: dict) -> dict[str, str]:
    """The numbers shown beside the .html picture."""
    timing, kv = data["timing"], data["kv"]
    latency = timing["block_latency_s"]
    rows = {"status": data["status"], "device": f"{data['run']['device']} "
            f"({data['run']['dtype']})", "frames": f"{data['frames']['written']} of "
            f"{data['frames']['requested']} at {data['frames']['output_fps']:g} fps",
            "blocks": str(timing["blocks"])}
    if latency["p50"] is not None:
        rows["block latency p50 / p95"] = (f"{latency['p50'] * 1000:.1f} ms / "
                                           f"{latency['p95'] * 1000:.1f} ms")
    if kv.get("pages_peak") is not None:
        rows["KV pages peak / total"] = f"{kv['pages_peak']} / {kv['pages_total']}"
    rows["peak RSS"] = f"{data['memory']['peak_rss_bytes'] / 2**20:.0f} MiB"
    return rows

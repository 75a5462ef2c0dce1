"""`ardiff bench CONFIG --workers N`: one worker against N on the same job (ardiff.launch)."""

from __future__ import annotations

import json
import sys

import typer

from ardiff.errors import EXIT_FAILED
from ardiff_cli import _options as options
from ardiff_cli import _render as render


def run(run_config, workers: int, repeats: int, json_path: str | None, json_out=None) -> None:
    """Measure, then print the table (and the JSON: `--json -` to `json_out`, default
    sys.stdout); exit 1 if the JSON cannot be written."""
    from ardiff.bench.speedup import measure_speedup  # imports torch

    report = measure_speedup(run_config, workers, repeats,
                             on_progress=lambda msg: print(f"bench: {msg}", file=sys.stderr))
    data = report.to_dict()
    if json_path == "-":
        print(json.dumps(data, indent=2), file=json_out or sys.stdout)
        return
    json_error = options.write_json_file(json_path, data) if json_path else None
    print_speedup(data)
    if json_error:
        print(f"error: {json_error}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED)


def print_speedup(data: dict) -> None:
    one, many = data["one_worker"], data["workers"]
    table = render._table(f"Workers: 1 vs {many['workers']} (median of {len(one['wall_s'])})",
                          "measure", "1 worker", f"{many['workers']} workers", "ideal")
    table.add_row("wall time (start to files written)", f"{one['wall_s_median']:.2f} s",
                  f"{many['wall_s_median']:.2f} s ({data['wall_ratio']:.2f}x)", "")
    table.add_row("rollout time", f"{one['rollout_s_median']:.2f} s",
                  f"{many['rollout_s_median']:.2f} s", "")
    table.add_row("speedup (wall / rollout)", "1.00",
                  f"{data['speedup']:.2f} / {data['rollout_speedup']:.2f}",
                  f"{data['ideal']:.2f}")
    table.add_row("frames identical", "", "yes" if data["frames_identical"] else "no", "yes")
    table.add_row("load average (1, 5, 15 min)", "",
                  " ".join(f"{x:.2f}" for x in data["load_average"]), "")
    render.console.print(table)

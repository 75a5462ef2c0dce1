"""What a finished run leaves on the terminal and in `--json`: warnings, the stats, the
summary, then the exit code (`ardiff rollout` and `ardiff play` end the same way)."""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any, Optional

import typer

from ardiff.errors import EXIT_FAILED
from ardiff_cli import _options as options


def finish_run(report, json_path: Optional[str], quiet: bool, debug: bool,
               picture_error: Optional[str] = None, json_out: Any = None,
               timeline: Any = None) -> None:
    """Print and write what the run left; exit with its code (1 if only the stats or the
    picture failed). A torchrun rank other than 0 writes nothing: rank 0 reports the job.
    `--json -` prints to `json_out` (default sys.stdout; ardiff_cli._stdout). `timeline`
    (ardiff_cli._timeline): its file is written and `--json` lists its blocks."""
    if not report.is_primary:
        if report.error is not None:  # None: rank 0 reports it (ardiff.launch.torchrun)
            print(f"error: {' '.join(report.error.split())}", file=sys.stderr)
        raise typer.Exit(report.exit_code)
    blocks = None if timeline is None or timeline.path is None else timeline.log.records
    timeline_error = None if timeline is None else timeline.write()
    json_error = (_emit(report, json_path, quiet, json_out or sys.stdout, blocks)
                  or picture_error or timeline_error)
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


def _emit(report, json_path: Optional[str], quiet: bool, json_out: Any,
          blocks: Optional[list] = None) -> Optional[str]:
    """Warnings, the JSON (with `blocks` when given) and the summary; returns why the JSON
    file could not be written."""
    data = report.to_dict()
    if blocks is not None:
        data["blocks"] = blocks
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    json_error = None
    if json_path == "-":
        print(json.dumps(data, indent=2), file=json_out)
    elif json_path:
        json_error = options.write_json_file(json_path, data, kept="the video is kept; ")
    if not quiet:
        from ardiff_cli import _render as render

        render.print_rollout(data, to_stderr=json_path == "-")
    return json_error

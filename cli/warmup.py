"""`ardiff warmup CONFIG`: load, plan, run the pipeline's warmup requests, check every page came back."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ardiff.errors import WarmupError
from ardiff_cli import _options as options
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors
from ardiff_cli._stdout import json_stdout


def warmup_command(
    config: Path = options.ConfigArg,
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    budget: str = options.BudgetOpt,
    overrides: options.OverrideList = options.SetOpt,
    as_json: bool = options.JsonOpt,
    debug: bool = options.DebugOpt,
) -> None:
    """Run the pipeline's warmup requests and check that every KV page came back.

    SIGINT, SIGTERM and SIGHUP stop it at once (nothing is written): exit 130.
    """
    with signals.StopSignals() as stop_signals, json_stdout(as_json) as json_out:
        with handle_errors(debug):
            from ardiff.engine.build import build_runner  # imports torch: only when it runs
            from ardiff_cli import _render as render  # rich: only when the command runs

            runner = build_runner(options.load_run_config(config, overrides, {
                "runtime.device": device, "runtime.dtype": dtype,
                "runtime.memory_budget": budget}))
            try:
                report = runner.warmup()
            finally:
                runner.close()
        stop_signals.hold()  # the summary is written whatever comes now
        summary = render.warmup_summary(runner, report)
        if as_json:
            print(json.dumps(summary, indent=2), file=json_out)
        else:
            render.print_warmup(summary)
        with handle_errors(debug):
            _check_pages(report)
        if report.skipped_reason and not as_json:
            typer.echo(f"warmup skipped: {report.skipped_reason}", err=True)


def _check_pages(report) -> None:
    if report.leaked_pages:
        raise WarmupError(f"warmup leaked {report.leaked_pages} KV pages (in use "
                          f"{report.pages_in_use_before} before, {report.pages_in_use_after} "
                          f"after); the pipeline or ardiff holds pages it should give back")

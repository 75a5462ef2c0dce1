"""`ardiff inspect-spec CONFIG`: the pipeline's KV geometry and memory plan, its weights and
whether they fit a device (`--device-memory 24GiB`). It constructs the pipeline (runs its
code) but loads no weights and allocates nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ardiff_cli import _options as options
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors
from ardiff_cli._stdout import json_stdout

DeviceMemoryOpt = typer.Option(
    None, "--device-memory", metavar="SIZE", show_default="the device's free memory, if here",
    help="The device's memory (24GiB): say whether the weights, the KV plan and a margin "
         "for activations fit in it, and place the weights as a run there would.")


def inspect_spec_command(
    config: Path = options.ConfigArg,
    budget: str = options.BudgetOpt,
    dtype: str = options.DtypeOpt,
    page_tokens: int = options.PageTokensOpt,
    device: str = options.DeviceOpt,
    workers: int = options.WorkersOpt,
    cfg_parallel: int = options.CfgParallelOpt,
    device_memory: Optional[str] = DeviceMemoryOpt,
    overrides: options.OverrideList = options.SetOpt,
    as_json: bool = options.JsonOpt,
    debug: bool = options.DebugOpt,
) -> None:
    """Show the KV spec a pipeline declares, the memory plan for it and the weights beside it.

    It constructs the pipeline (importing and running the code `pipeline.entry` names:
    trust a config as you would a script), reads its spec and plans; it loads no weights
    and allocates nothing.
    """
    from ardiff.engine.build import inspect_spec  # the config layer: only when the command runs
    from ardiff.engine.placement import parse_device_memory
    from ardiff_cli import _render as render  # rich: only when the command runs

    with signals.StopSignals() as stop_signals, json_stdout(as_json) as json_out:
        with handle_errors(debug):
            memory = None if device_memory is None else parse_device_memory(device_memory)
            report = inspect_spec(options.load_run_config(config, overrides, {
                "runtime.memory_budget": budget, "runtime.dtype": dtype,
                "runtime.kv.page_tokens": page_tokens, "runtime.device": device,
                "runtime.parallel.workers": workers, "runtime.parallel.cfg": cfg_parallel}),
                memory)
        stop_signals.hold()  # the report is written whatever comes now
        if as_json:
            print(json.dumps(report.to_dict(), indent=2), file=json_out)
        else:
            render.print_spec_report(report)

"""`ardiff inspect-spec CONFIG`: the pipeline's KV geometry and memory plan, without weights."""

from __future__ import annotations

import json
from pathlib import Path

from ardiff.config import load_config
from ardiff.inspect import inspect_spec
from ardiff_cli import options, render
from ardiff_cli.errors import handle_errors


def inspect_spec_command(
    config: Path = options.ConfigArg,
    budget: str = options.BudgetOpt,
    dtype: str = options.DtypeOpt,
    page_tokens: int = options.PageTokensOpt,
    overrides: options.OverrideList = options.SetOpt,
    as_json: bool = options.JsonOpt,
    debug: bool = options.DebugOpt,
) -> None:
    """Show the KV spec a pipeline declares and the memory plan for it (dry run)."""
    with handle_errors(debug):
        flags = options.flag_overrides(**{"runtime.memory_budget": budget, "runtime.dtype": dtype,
                                          "runtime.kv.page_tokens": page_tokens})
        report = inspect_spec(load_config(config, [*(overrides or []), *flags]))
        if as_json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            render.print_spec_report(report)

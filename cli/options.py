"""Option definitions shared by every command, so each flag means one thing everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

ConfigArg = typer.Argument(..., help="Run config (YAML).", show_default=False)
OptionalConfigArg = typer.Argument(None, help="Run config (YAML); omit for the embedded default.",
                                   show_default=False)
SetOpt = typer.Option(None, "--set", metavar="KEY=VALUE",
                      help="Override any config key, e.g. --set runtime.kv.window_frames=12 "
                           "(repeatable).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of tables.")
DebugOpt = typer.Option(False, "--debug", help="Show the traceback of an error.")
BudgetOpt = typer.Option(None, "--budget", metavar="SIZE",
                         help="KV memory budget: bytes (6GiB, 512MiB) or a fraction of free "
                              "memory (0.8).")
DtypeOpt = typer.Option(None, "--dtype", help="KV and model dtype: float32, bfloat16, float16.")
PageTokensOpt = typer.Option(None, "--page-tokens", help="Tokens per KV page (default: one frame).")
DeviceOpt = typer.Option(None, "--device", help="cpu, cuda, cuda:N or auto.")

OptionalPath = Optional[Path]
OverrideList = Optional[List[str]]


def flag_overrides(**flags: object) -> list[str]:
    """Turn CLI flags given as `dotted_key=value` pairs into `--set` overrides (None: unset).

    Values are JSON-encoded (JSON is YAML), so a prompt like `a: b` stays a string.
    """
    return [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def load_run_config(config: Optional[Path], overrides: Optional[List[str]],
                    flags: dict[str, object]):
    """The run config: the file (None: the embedded default), then `--set`, then the flags."""
    from ardiff.config.run import load_config

    return load_config(config, [*(overrides or []), *flag_overrides(**flags)])

"""The `ardiff` root: a short app that registers one module per command."""

from __future__ import annotations

import sys

import typer

from ardiff_cli import bench, config_schema, inspect_spec, rollout, warmup

app = typer.Typer(
    name="ardiff",
    help="Run autoregressive (block-causal) video diffusion models over a paged KV cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("rollout")(rollout.rollout_command)
app.command("inspect-spec")(inspect_spec.inspect_spec_command)
app.command("warmup")(warmup.warmup_command)
app.command("bench")(bench.bench_command)
app.command("config-schema")(config_schema.config_schema_command)


@app.callback()
def _root() -> None:
    """Exit codes: 0 ok, 1 run failed, 2 bad usage/config/spec, 3 does not fit, 130 interrupted."""


def main() -> None:
    """Entry point of the `ardiff` script: usage errors become one `error:` line, exit 2."""
    try:
        code = app(standalone_mode=False)
    except Exception as exc:  # Typer's (click's) usage errors; ardiff's are handled per command
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        message = " ".join(exc.format_message().split())
        if message:  # empty when the help was shown for a bare `ardiff`
            command = exc.ctx.command_path if getattr(exc, "ctx", None) else "ardiff"
            print(f"error: {message} (see `{command} --help`)", file=sys.stderr)
        code = exc.exit_code
    sys.exit(code if isinstance(code, int) else 0)

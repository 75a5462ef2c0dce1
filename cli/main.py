"""The `ardiff` root: a short app that registers one module per command.

Exit codes (ardiff.errors; docs/errors.md): 0 ok, 1 the run failed, 2 bad usage, config
or spec, 3 does not fit in memory, 130 interrupted (SIGINT, SIGTERM or SIGHUP:
ardiff_cli._signals). Stdout that cannot be written (a pipe its reader closed, as
`| head -c 10` does; a full disk) ends the command with exit 1 and no traceback: silently
for a closed pipe, else with one `error: stdout: ...` line. Files already written
(videos, `--json PATH`) are complete by then. With `--json -` stdout holds the JSON alone:
what a pipeline prints goes to stderr (ardiff_cli._stdout).
"""

from __future__ import annotations

import errno
import os
import sys

from ardiff_cli._early_signals import hold_stop_signals

hold_stop_signals()  # first: a stop signal while the rest imports still ends in exit 130

import typer

import ardiff
from ardiff.errors import EXIT_FAILED, EXIT_INTERRUPTED
from ardiff_cli import _early_signals as early
from ardiff_cli import _signals as signals
from ardiff_cli import bench, config_schema, inspect_spec, play, rollout, serve, warmup
from ardiff_cli._exit import leave, note_threads_at_start
from ardiff_cli._help import Command, Group
from ardiff_cli._stdout import STDOUT_MARK, MarkedStdout

app = typer.Typer(
    name="ardiff",
    cls=Group,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, pwsh)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("rollout", cls=Command)(rollout.rollout_command)
app.command("inspect-spec", cls=Command)(inspect_spec.inspect_spec_command)
app.command("warmup", cls=Command)(warmup.warmup_command)
app.command("bench", cls=Command)(bench.bench_command)
app.command("config-schema", cls=Command)(config_schema.config_schema_command)
app.command("play", cls=Command)(play.play_command)
app.command("serve", cls=Command)(serve.serve_command)


def _print_version(value: bool) -> None:
    if value:
        print(f"ardiff {ardiff.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True,
                                       callback=_print_version,
                                       help="Print the version and exit.")) -> None:
    """Run autoregressive (block-causal) video diffusion models over a paged KV cache.

    Exit codes: 0 ok, 1 the run failed (or stdout could not be written), 2 bad usage,
    config or spec, 3 does not fit in memory, 130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
    """


def main() -> None:
    """Entry point of the `ardiff` script: usage errors become one `error:` line, exit 2;
    stdout that cannot be written, exit 1 (see the module docstring)."""
    stdout = sys.stdout
    sys.stdout = MarkedStdout(stdout)
    signals.end_with_the_process()
    note_threads_at_start()
    try:
        held = early.take_held()
        if held is not None:  # it came while the script imported: nothing has started
            raise KeyboardInterrupt(held)
        code = _run_app()
        sys.stdout.flush()  # now, not at interpreter exit where an error cannot be handled
    except OSError as exc:
        if not getattr(exc, STDOUT_MARK, False):
            raise
        code = _stdout_failed(stdout, exc)
    except KeyboardInterrupt as exc:  # a stop signal before a command installed its handlers
        print(f"error: interrupted{f' by {exc}' if str(exc) else ''}", file=sys.stderr)
        code = EXIT_INTERRUPTED
    else:
        if code == EXIT_INTERRUPTED and early.raised():  # Typer turned it into exit 130
            print(f"error: interrupted by {early.raised()}", file=sys.stderr)
    finally:
        sys.stdout = stdout
        early.settle()  # from here a signal changes nothing
    leave(code)  # not waiting for a thread a pipeline left running


def _run_app() -> int:
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
    return code if isinstance(code, int) else 0


def _stdout_failed(stdout, exc: OSError) -> int:
    """End quietly: stdout goes to /dev/null (so the exit flush cannot fail again), one line
    on stderr unless the reader just went away, exit 1."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's captured stream)
        pass
    if exc.errno != errno.EPIPE:
        print(f"error: stdout: cannot write ({type(exc).__name__}: {exc}); files already "
              f"written are complete; check free disk space or where stdout goes",
              file=sys.stderr)
    return EXIT_FAILED

"""Every command's `--help` at 80 columns: paragraphs wrapped once, no internal names, one
metavar style, a default for every option (or "from the config"); --version, -h, completion."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

import ardiff
from ardiff_cli.main import app

WIDTH = 80
COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]
INTERNAL = re.compile(r"ardiff_cli|ardiff\.[a-z_]+\.|Runner\b|execute_batch|_signals|"
                      r"runtime\.compile\b|target:")
TYPER_METAVAR = re.compile(r"<(bool|str|int|float|path)>|\{[A-Za-z]+\}")
# Options whose absence is a mode of its own (no JSON, no plot, no sweep...), said in their help.
NO_DEFAULT = {"--json", "--report", "--plot", "--sweep-frames", "--workers", "--batch", "--set",
              "--token", "--token-file", "--record", "--actions-out", "--timeline",
              "--allowed-host", "--allowed-origin"}


def render(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(WIDTH),
                                                             "TERMINAL_WIDTH": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


def description(text: str) -> list[list[str]]:
    """The paragraphs above the first panel, each a list of its lines (stripped)."""
    head = text.split("╭", 1)[0].splitlines()
    paragraphs: list[list[str]] = [[]]
    for line in head:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p and not p[0].startswith("Usage:")]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_reads_well_at_80_columns(command: str) -> None:
    text = render(*([command] if command else []))
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert not INTERNAL.search(text), INTERNAL.search(text)
    assert not TYPER_METAVAR.search(text), TYPER_METAVAR.search(text)
    for paragraph in description(text):
        for line, following in zip(paragraph, paragraph[1:]):
            room = WIDTH - 2 - len(line)  # Rich's one-space margins
            assert len(following.split()[0]) + 1 > room, f"broken wrap: {line!r} / {following!r}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_shows_its_default(command: str) -> None:
    click_command = get_command(app).commands[command]  # type: ignore[attr-defined]
    for param in click_command.params:
        if getattr(param, "is_flag", False) or not param.opts[0].startswith("--"):
            continue
        if param.opts[0] in NO_DEFAULT:
            continue
        shown = isinstance(param.show_default, str) or (param.default is not None
                                                        and param.show_default is not False)
        assert shown, f"ardiff {command} {param.opts[0]}: no default shown"


def test_from_the_config_is_said_where_the_config_decides() -> None:
    text = render("rollout")
    assert "[default: (from the config)]" in text


def test_version_and_short_help() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert (result.exit_code, result.output) == (0, f"ardiff {ardiff.__version__}\n")
    assert "Usage: ardiff rollout" in CliRunner().invoke(app, ["rollout", "-h"]).output


def test_completion_script_is_shown() -> None:
    result = CliRunner().invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0, result.output
    assert "_ardiff_completion" in result.output or "complete" in result.output

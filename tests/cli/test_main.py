"""The `ardiff` script: usage errors are one `error:` line with exit 2, like every other error.

In-process through the script's `main()` (the `ardiff_main` fixture); one case also through
the installed command, in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ARDIFF = str(Path(sys.executable).parent / "ardiff")
USAGE_ERRORS = {
    "bad-value": (["rollout", "--frames", "abc"],
                  r"Invalid value for '--frames'.*\(see `ardiff rollout --help`\)"),
    "unknown-flag": (["rollout", "--bogus"],
                     r"No such option: --bogus \(see `ardiff rollout --help`\)"),
    "missing-argument": (["inspect-spec"],
                         r"Missing argument 'config'. \(see `ardiff inspect-spec --help`\)"),
    "unknown-command": (["nosuch"], r"No such command 'nosuch'. \(see `ardiff --help`\)"),
}


def assert_one_usage_line(exit_code: int, stderr: str, message: str) -> None:
    assert exit_code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in stderr and "Usage:" not in stderr


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_errors_are_one_line_with_exit_2(case, ardiff_main, tmp_path, monkeypatch):
    args, message = USAGE_ERRORS[case]
    monkeypatch.chdir(tmp_path)
    result = ardiff_main(*args)
    assert_one_usage_line(result.exit_code, result.stderr, message)


def test_help_still_exits_0(ardiff_main):
    result = ardiff_main("--help")
    assert result.exit_code == 0 and "rollout" in result.stdout


@pytest.mark.slow
def test_the_installed_command_gives_the_same_one_line(tmp_path):
    args, message = USAGE_ERRORS["unknown-flag"]
    result = subprocess.run([ARDIFF, *args], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert_one_usage_line(result.returncode, result.stderr, message)

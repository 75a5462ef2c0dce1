"""The `ardiff` script: usage errors are one `error:` line with exit 2, like every other error."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ARDIFF = str(Path(sys.executable).parent / "ardiff")


@pytest.mark.parametrize("args, message", [
    (["rollout", "--frames", "abc"], r"Invalid value for '--frames'.*\(see `ardiff rollout --help`\)"),
    (["rollout", "--bogus"], r"No such option: --bogus \(see `ardiff rollout --help`\)"),
    (["inspect-spec"], r"Missing argument 'config'. \(see `ardiff inspect-spec --help`\)"),
    (["nosuch"], r"No such command 'nosuch'. \(see `ardiff --help`\)"),
], ids=["bad-value", "unknown-flag", "missing-argument", "unknown-command"])
def test_usage_errors_are_one_line_with_exit_2(args, message, tmp_path):
    result = subprocess.run([ARDIFF, *args], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in result.stderr and "Usage:" not in result.stderr


def test_help_still_exits_0(tmp_path):
    result = subprocess.run([ARDIFF, "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "rollout" in result.stdout

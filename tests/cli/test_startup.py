"""`ardiff --help` and `inspect-spec` must not import torch before they need it (start-up time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WAN_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wan_spec_only.yaml"
PROBE = """
import sys
from ardiff_cli.main import app
try:
    app({args!r})
except SystemExit:
    pass
print("torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["inspect-spec", str(WAN_EXAMPLE), "--json"]],
                         ids=["help", "inspect-spec"])
def test_command_does_not_import_torch(args, tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert "torch imported: False" in result.stderr, result.stderr

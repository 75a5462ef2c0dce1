"""`ardiff --help` and `inspect-spec` must not import torch before they need it (start-up time).

Only a fresh interpreter can tell what a command imports, so this is a subprocess test: one
process runs both commands and reports after each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WAN_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wan_spec_only.yaml"
COMMANDS = {"help": ["--help"], "inspect-spec": ["inspect-spec", str(WAN_EXAMPLE), "--json"]}
PROBE = """
import sys
from ardiff_cli.main import app
for name, args in {commands!r}.items():
    try:
        app(args)
    except SystemExit:
        pass
    print(f"{{name}}: torch imported: {{'torch' in sys.modules}}", file=sys.stderr)
"""


@pytest.mark.slow
def test_help_and_inspect_spec_do_not_import_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE.format(commands=COMMANDS)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    for name in COMMANDS:  # in order: a torch import by --help shows up first
        assert f"{name}: torch imported: False" in result.stderr, result.stderr

"""`ardiff --help` and `inspect-spec` must not import what they do not need (start-up time).

Only a fresh interpreter can tell what a command imports, so these are subprocess tests:
one process runs both commands and reports `sys.modules` after each; `--help` alone runs
under `python -X importtime`, whose log names every module imported, even one removed later.
"""

from __future__ import annotations

import re
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
HELP = """
from ardiff_cli.main import app
try:
    app(["--help"])
except SystemExit:
    pass
"""
# What `--help` must not import: the runtime (torch, numpy, video), the config layer (yaml,
# pydantic, importlib.metadata for entry points) and the Rich tables / progress of commands.
NOT_FOR_HELP = ("torch", "numpy", "av", "PIL", "yaml", "pydantic", "importlib.metadata",
                "ardiff.config", "ardiff.engine", "ardiff.bench", "ardiff_cli._render",
                "ardiff_cli._progress", "ardiff_cli._bench_table", "rich.progress")


@pytest.mark.slow
def test_help_and_inspect_spec_do_not_import_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE.format(commands=COMMANDS)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    for name in COMMANDS:  # in order: a torch import by --help shows up first
        assert f"{name}: torch imported: False" in result.stderr, result.stderr


@pytest.mark.slow
def test_help_imports_neither_the_runtime_nor_the_config_layer(tmp_path):
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", HELP], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert "Usage" in result.stdout, result.stdout + result.stderr
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", result.stderr,
                              re.MULTILINE))
    assert "ardiff_cli.main" in imported and "typer" in imported  # the log is read right
    assert sorted(imported & set(NOT_FOR_HELP)) == []

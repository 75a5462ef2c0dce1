"""cli/_stdout.py: while a command writes `--json -`, stdout holds the JSON alone; Python's
print, a write to descriptor 1 and C's buffered printf go to stderr. The installed command
is tested with a printing pipeline in tests/cli/test_rollout.py."""

from __future__ import annotations

import ctypes
import json
import os
import sys

import pytest
from typer.testing import CliRunner

from ardiff_cli._stdout import json_stdout
from ardiff_cli.main import app

PRINTING = """
from spec_pipelines import GoodPipeline


class Printing(GoodPipeline):
    def __init__(self, **args):
        print("printed while constructed")
        super().__init__(**args)

    def load(self, device, dtype):
        print("printed while loaded")
        super().load(device, dtype)
"""


def test_whatever_else_writes_to_stdout_goes_to_stderr(capfd):
    with json_stdout(True) as json_out:
        print("a print")
        os.write(1, b"a write to fd 1\n")
        ctypes.CDLL(None).printf(b"a C printf\n")
        print('{"ok": true}', file=json_out)
    print("after")

    out, err = capfd.readouterr()
    assert out == '{"ok": true}\nafter\n'
    assert sorted(err.splitlines()) == ["a C printf", "a print", "a write to fd 1"]


def test_inactive_it_changes_nothing(capfd):
    with json_stdout(False) as json_out:
        assert json_out is sys.stdout
        os.write(1, b"on stdout\n")
    assert capfd.readouterr().out == "on stdout\n"


@pytest.mark.parametrize("command", ["inspect-spec", "warmup"])
def test_the_json_of_inspect_spec_and_warmup_is_all_of_stdout(tmp_path, command):
    (tmp_path / "printing.py").write_text(PRINTING)
    (tmp_path / "run.yaml").write_text('{"pipeline": {"entry": "printing.py:Printing"}, '
                                       '"runtime": {"memory_budget": "1MiB"}}')

    result = CliRunner().invoke(app, [command, str(tmp_path / "run.yaml"), "--json"])

    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(result.stdout), dict)
    assert "printed while constructed" in result.stderr

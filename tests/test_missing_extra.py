"""A missing optional extra is one line naming `pip install 'ardiff[...]'`, never a traceback
(ardiff/extras.py; #35): from a command, and from make_tiny without the `wan` extra."""

from __future__ import annotations

import sys

import pytest
import typer

from ardiff.extras import extras_by_module, missing_extra_message
from ardiff_cli._errors import handle_errors


def test_every_extra_is_known_by_its_import_name():
    modules = extras_by_module()
    assert modules["diffusers"] == modules["ftfy"] == "wan"
    assert modules["prometheus_client"] == "serve" and modules["matplotlib"] == "plot"


def test_the_message_names_the_extra_and_the_install():
    exc = ModuleNotFoundError("No module named 'diffusers.models'", name="diffusers.models")
    assert missing_extra_message(exc, "make_tiny") == (
        "make_tiny needs the 'wan' extra (diffusers is not installed): pip install 'ardiff[wan]'")
    assert missing_extra_message(ModuleNotFoundError("x", name="no_such_thing")) is None


def test_a_command_prints_one_line_and_exits_2(capsys):
    with pytest.raises(typer.Exit) as exit_info:
        with handle_errors(debug=False):
            raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
    assert exit_info.value.exit_code == 2
    assert capsys.readouterr().err == ("error: this command needs the 'serve' extra (fastapi is "
                                       "not installed): pip install 'ardiff[serve]'\n")


def test_another_missing_module_is_still_a_bug():
    with pytest.raises(ModuleNotFoundError):
        with handle_errors(debug=False):
            raise ModuleNotFoundError("No module named 'nope'", name="nope")


def test_make_tiny_without_the_wan_extra_is_one_line(tmp_path, monkeypatch, capsys):
    from ardiff.pipelines.causal_wan import make_tiny

    monkeypatch.setitem(sys.modules, "diffusers", None)  # as if not installed
    monkeypatch.setattr(sys, "argv", ["make_tiny", "--out", str(tmp_path / "m")])
    with pytest.raises(SystemExit) as exit_info:
        make_tiny.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: make_tiny needs the 'wan' extra (diffusers is "
                                       "not installed): pip install 'ardiff[wan]'\n")

"""Both make_tiny commands: a bad argument is one line on stderr, exit 2, nothing written;
they never write into a folder holding files they did not make."""

from __future__ import annotations

import sys

import pytest

from ardiff.pipelines.causal_wan import make_tiny as causal_wan_tiny
from ardiff.pipelines.matrix_game import make_tiny as matrix_game_tiny

COMMANDS = {"causal-wan": causal_wan_tiny.main, "matrix-game": matrix_game_tiny.main}


def fails(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("family", sorted(COMMANDS))
@pytest.mark.parametrize("argv, message", [
    (["--out", "{out}", "--num-layers", "0"], "--num-layers 0: give a number of layers >= 1"),
    (["--out", "{out}", "--seed", "-1"], "--seed -1: give a seed >= 0"),
    ([], "--out is required"),
    (["--out", "{file}"], "is a file; give a folder path"),
    (["--out", "{file}/sub"], "lies under the file"),
    (["--out", "{foreign}"], "holds 'notes.txt' (and 0 more) that it did not write"),
    (["--out", "{out}", "--shape", "huge"], "invalid choice: 'huge'"),
])
def test_bad_arguments_are_one_line_errors(family, argv, message, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    argv = [a.format(out=tmp_path / "new", file=tmp_path / "file",
                     foreign=tmp_path / "foreign") for a in argv]
    assert message in fails(COMMANDS[family], argv, capsys)
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine"
    assert [p.name for p in (tmp_path / "foreign").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("family", sorted(COMMANDS))
def test_a_missing_extra_is_named(family, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # as if not installed
    err = fails(COMMANDS[family], ["--out", tmp_path / "new"], capsys)
    assert "needs the 'wan' extra (diffusers is not installed): pip install 'ardiff[wan]'" in err

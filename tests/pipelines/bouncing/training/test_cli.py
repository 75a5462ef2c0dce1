"""The world model's commands as tools people run (`training/cli.py`): a bad argument is one
line on stderr and exit 2, never a traceback; `--json` never overwrites what the command
reads; a run's record keeps no absolute path."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import ardiff
from ardiff.pipelines.bouncing.checkpoint import shipped_weights
from ardiff.pipelines.bouncing.training import cli, evaluate, games, stages


def usage_error(parser, argv, capsys) -> str:
    """Parse argv, expect exit 2 and return the one line on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["--worlds", "0"], "argument --worlds: '0' must be >= 1"),
    (["--frames", "x"], "argument --frames: 'x' is not a whole number"),
    (["--horizon-worlds", "-1"], "argument --horizon-worlds: '-1' must be >= 0"),
    (["--weights", "missing.safetensors"], "'missing.safetensors' is not found; give a "
                                           ".safetensors file"),
    (["--worlds"], "argument --worlds: expected one argument"),
])
def test_evaluate_refuses_bad_arguments_in_one_line(argv, message, capsys):
    assert message in usage_error(evaluate.parser(), argv, capsys)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "argument --batch: '0' must be >= 1"),
    (["--lr", "nan"], "argument --lr: 'nan' must be a finite number > 0"),
    (["--drift-lr", "0"], "argument --drift-lr: '0' must be a finite number > 0"),
    (["--jitter", "1.5"], "argument --jitter: '1.5' must be a number in [0, 1]"),
    (["--init", "missing.safetensors"], "argument --init: 'missing.safetensors' is not found"),
    (["--stage", "nope"], "argument --stage: invalid choice: 'nope'"),
])
def test_train_refuses_bad_arguments_in_one_line(argv, message, capsys):
    assert message in usage_error(stages.parser(), argv, capsys)


@pytest.mark.parametrize("argv, message", [
    (["--games", "0"], "argument --games: '0' must be >= 1"),
    (["--world", "-2"], "argument --world: '-2' must be >= 0"),
])
def test_games_refuses_bad_arguments_in_one_line(argv, message, capsys):
    assert message in usage_error(games.parser(), argv, capsys)


def test_weights_that_are_a_folder_are_refused(tmp_path, capsys):
    line = usage_error(evaluate.parser(), ["--weights", str(tmp_path)], capsys)
    assert f"'{tmp_path}' is a folder" in line


def test_a_typed_error_is_one_line_with_its_exit_code(tmp_path, capsys):
    text = tmp_path / "weights.safetensors"
    text.write_text("not weights\n")
    args = evaluate.parser().parse_args(["--weights", str(text), "--worlds", "1",
                                         "--horizon-worlds", "0"])
    with pytest.raises(SystemExit) as exit_info:
        cli.run(lambda: evaluate.evaluate_command(args))
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: pipeline.args.weights: cannot read") and "train" in line


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    def stopped() -> None:
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as exit_info:
        cli.run(stopped)
    assert exit_info.value.code == 130 and capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize("frames, horizon, message", [
    (2, 2000, "--frames: 2 leaves no 8 generated frames after the 4 start frames to score; "
              "use --frames 12 or more"),
    (96, 10, "--horizon-frames: 10 has no frame to score (every 50th is); use 50 or more, "
             "or --horizon-worlds 0"),
])
def test_games_too_short_to_score_are_refused(frames, horizon, message):
    with pytest.raises(ardiff.ConfigError, match=re.escape(message)):
        evaluate.evaluate(worlds=1, frames=frames, horizon_frames=horizon)


def test_json_onto_the_weights_it_reads_is_refused(tmp_path):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    args = evaluate.parser().parse_args(["--weights", str(weights), "--json", str(weights)])
    with pytest.raises(ardiff.ConfigError, match=r"--json: .* is a file this command reads"):
        evaluate.evaluate_command(args)
    shipped = evaluate.parser().parse_args(["--json", str(shipped_weights())])
    with pytest.raises(ardiff.ConfigError, match="write the output to another file"):
        evaluate.evaluate_command(shipped)


def test_training_writes_into_the_package_only_when_asked():
    assert stages.parser().parse_args([]).ship is False
    assert stages.parser().parse_args(["--ship"]).ship is True
    assert stages.parser().parse_args([]).out == Path("world-ckpt")


def test_a_record_keeps_no_absolute_path(tmp_path):
    assert cli.portable(tmp_path / "base.safetensors") == "base.safetensors"
    assert cli.portable(Path("world-ckpt")) == "world-ckpt"
    assert cli.portable(argparse.Namespace) == str(argparse.Namespace)
    assert [cli.portable(v) for v in (1, 0.5, True, None, "x")] == [1, 0.5, True, None, "x"]


def test_the_shipped_record_keeps_no_absolute_path():
    record = shipped_weights().with_suffix(".json").read_text()
    assert '"/' not in record

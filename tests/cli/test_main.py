"""The `ardiff` script: usage errors are one `error:` line with exit 2, like every other error;
stdout that cannot be written (a closed pipe, a full disk) ends the command with exit 1 and no
traceback.

In-process through the script's `main()` (the `ardiff_main` fixture, or main() on a broken
stdout); one case of each also through the installed command, in a subprocess."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ARDIFF = str(Path(sys.executable).parent / "ardiff")
USAGE_ERRORS = {
    "bad-value": (["rollout", "--frames", "abc"],
                  r"Invalid value for '--frames'.*\(see `ardiff rollout --help`\)"),
    "unknown-flag": (["rollout", "--bogus"],
                     r"No such option: --bogus \(see `ardiff rollout --help`\)"),
    "missing-argument": (["inspect-spec"],
                         r"Missing argument 'CONFIG'. \(see `ardiff inspect-spec --help`\)"),
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


# -- stdout that cannot be written: exit 1, no traceback ----------------------------------------
FAULT_PIPELINES = Path(__file__).resolve().parents[1] / "support" / "fault_pipelines.py"
STDOUT_FULL = ("error: stdout: cannot write (OSError: [Errno 28] No space left on device); files "
               "already written are complete; check free disk space or where stdout goes")
STDOUT_COMMANDS = {"rollout": ["rollout", "run.yaml", "--json", "-", "--quiet"],
                   "inspect-spec": ["inspect-spec", "run.yaml", "--json"]}


def fault_config(folder: Path) -> Path:
    path = folder / "run.yaml"
    path.write_text(f"pipeline: {{entry: '{FAULT_PIPELINES}:FaultPipeline'}}\n"
                    f"runtime: {{device: cpu, memory_budget: 16MiB}}\n"
                    f"rollout: {{frames: 4, prompt: a}}\n"
                    f"output: {{path: out.npy, fps: 8}}\n")
    return path


def broken_stdout(kind: str):
    """A text stream like stdout: a pipe whose reader is gone (`| head -c 10`), or a full disk."""
    if kind == "full-disk":
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full here")
        return open("/dev/full", "w")
    read_end, write_end = os.pipe()
    os.close(read_end)
    return os.fdopen(write_end, "w")


@pytest.mark.parametrize("kind", ["closed-pipe", "full-disk"])
@pytest.mark.parametrize("command", list(STDOUT_COMMANDS))
def test_stdout_that_cannot_be_written_ends_quietly_with_exit_1(command, kind, tmp_path,
                                                                monkeypatch, capsys):
    from ardiff_cli.main import main

    fault_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    stdout = broken_stdout(kind)
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "argv", ["ardiff", *STDOUT_COMMANDS[command]])
    try:
        with pytest.raises(SystemExit) as end:
            main()
    finally:
        stdout.close()  # its descriptor now points at /dev/null: nothing fails here

    assert end.value.code == 1
    assert capsys.readouterr().err == ("" if kind == "closed-pipe" else STDOUT_FULL + "\n")
    if command == "rollout":  # the video was finished before the stats went to stdout
        assert np.load(tmp_path / "out.npy").shape == (4, 16, 16, 3)


def test_another_os_error_is_a_bug_and_keeps_its_traceback(monkeypatch):
    from ardiff_cli.main import main

    def broken_schema():
        raise OSError(errno.ENOSPC, "not stdout's")

    monkeypatch.setattr("ardiff.config.run.config_json_schema", broken_schema)
    monkeypatch.setattr(sys, "argv", ["ardiff", "config-schema"])
    with pytest.raises(OSError, match="not stdout's"):
        main()


@pytest.mark.slow
def test_the_installed_command_ends_quietly_on_a_closed_pipe_and_a_full_disk():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        piped = subprocess.run([ARDIFF, "config-schema"], stdout=write_end,
                               stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (piped.returncode, piped.stderr) == (1, "")
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            filled = subprocess.run([ARDIFF, "config-schema"], stdout=full,
                                    stderr=subprocess.PIPE, text=True, timeout=60)
        assert (filled.returncode, filled.stderr) == (1, STDOUT_FULL + "\n")


@pytest.mark.parametrize("value, shown", [("nan", "nan"), ("inf", "inf"), ("-inf", "-inf")])
def test_a_flag_that_is_not_a_finite_number_gets_the_configs_range_message(ardiff_main, value,
                                                                           shown, tmp_path):
    result = ardiff_main("rollout", "--fps", value, "-o", tmp_path / "x.npy")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: output.fps: {shown} is invalid; it must be a "
                                     f"finite number; try 16")
    assert not (tmp_path / "x.npy").exists()


def test_cli_modules_are_commands_or_private_helpers():
    """A module of cli/ is a command registered on the app (named for it), or a helper whose
    name starts with `_`: the public names of `ardiff_cli` are its commands."""
    import ardiff_cli
    from ardiff_cli.main import app

    commands = {info.callback.__module__.rsplit(".", 1)[1] for info in app.registered_commands}
    modules = {path.stem for path in Path(ardiff_cli.__file__).parent.glob("*.py")}
    public = {name for name in modules if not name.startswith("_")} - {"main"}
    assert public == commands, f"public non-command modules: {sorted(public - commands)}"

"""`ardiff play`: refused cleanly where it cannot run; played through a pseudo-terminal with
scripted keys, its action log replays frame for frame with `ardiff rollout --actions`."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import yaml
from pty_driver import Hangup, Keys, Signal, Wait, run_in_pty

from ardiff.config.play import PlayConfig, key_map
from ardiff_cli._keys import TerminalLost
from ardiff_cli._play_display import Pacer, describe_keys

REPO = Path(__file__).resolve().parents[2]
WORLD = ("none", "left", "right", "up", "down")


def test_a_pipeline_without_actions_is_refused(ardiff_main):
    result = ardiff_main("play", REPO / "configs" / "tiny-dit.yaml")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: pipeline: 'ardiff.pipelines.tiny_dit:TinyCausalDiT' declares no actions (no "
        "action_names); ardiff play needs an action-conditioned pipeline, such as the default "
        "one")


def test_without_a_terminal_play_is_refused(ardiff_main, tmp_path):
    result = ardiff_main("play", "-o", tmp_path / "game.mp4")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: ardiff play: needs a terminal (stdin and stderr are not both TTYs); to run "
        "actions without one, use ardiff rollout --actions FILE")
    assert list(tmp_path.iterdir()) == []


def test_an_action_log_in_a_missing_folder_is_refused(ardiff_main, tmp_path):
    log = tmp_path / "missing" / "log.yaml"
    result = ardiff_main("play", "-o", tmp_path / "game.mp4", "--actions-out", log)
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: --actions-out: '{log}' is in a folder that does "
                                     f"not exist ('{log.parent}'); create it first or pick "
                                     f"another path")


def test_the_key_map_printed_at_start():
    assert describe_keys(key_map(PlayConfig(), WORLD)) == (
        "(no key) none · ←/a left · →/d right · ↑/w up · ↓/s down · q/Ctrl-C quit")


class ScriptedKeys:
    """Each read returns the next list of keys."""

    def __init__(self, *reads: list[str]) -> None:
        self.reads = list(reads)

    def read(self, timeout_s: float) -> list[str]:
        keys = self.reads.pop(0) if self.reads else []
        if keys is TerminalLost:
            raise TerminalLost("end of input")
        return keys


def test_a_tick_takes_the_last_mapped_key_or_the_idle_action():
    keys = ScriptedKeys(["a", "x", "d"], [], ["w"], ["q"])
    pacer = Pacer(keys, key_map(PlayConfig(), WORLD), fps=1000.0)
    assert pacer.choose(0) == ("right",)   # a then d: the last one; x maps to nothing
    assert pacer.choose(1) == ("none",)    # no key: idle
    assert pacer.choose(2) == ("up",)
    assert pacer.choose(3) is None and pacer.quit


def test_a_lost_terminal_ends_the_tick_idle_and_asks_to_stop():
    lost = []
    keys = ScriptedKeys(["a"], TerminalLost)
    pacer = Pacer(keys, key_map(PlayConfig(), WORLD), fps=1000.0,
                  on_lost=lambda: lost.append(1))
    pacer.next_tick += 1000.0                              # a tick that would last 1000 s
    assert pacer.choose(0) == ("left",) and lost == [1]    # ended at once


@pytest.mark.heavy  # a game and its replay (5 s): keeps pytest -q under 90 s
def test_a_played_game_replays_frame_for_frame(ardiff_main, tmp_path):
    steps = [Wait("frame "), Keys(b"a", 0.3), Keys(b"\x1b[C", 0.3), Keys(b"w", 0.3),
             Keys(b"q", 0.2)]
    game = run_in_pty(["play", "-o", "game.npy", "--seed", "5"], steps, cwd=tmp_path)
    assert game.exit_code == 0, game.output
    assert "keys: (no key) none · ←/a left" in game.output
    log = yaml.safe_load((tmp_path / "game.actions.yaml").read_text())["actions"]
    assert {"left", "right", "up"} <= set(log)
    played = np.load(tmp_path / "game.npy")
    assert played.shape[0] == len(log)
    replay = ardiff_main("rollout", "--seed", "5", "--frames", len(log), "--actions",
                         tmp_path / "game.actions.yaml", "-o", tmp_path / "replay.npy", "-q")
    assert replay.exit_code == 0, replay.output
    assert np.array_equal(played, np.load(tmp_path / "replay.npy"))
    header = (tmp_path / "game.actions.yaml").read_text().splitlines()[1]
    assert header == (f"#   ardiff rollout --seed 5 --frames {len(log)} --actions "
                              f"game.actions.yaml -o replay.npy")


def assert_the_game_is_kept(folder: Path) -> None:
    """The video and its action log, one entry per frame, both whole."""
    log = yaml.safe_load((folder / "game.actions.yaml").read_text())["actions"]
    assert "left" in log
    assert np.load(folder / "game.npy").shape[0] == len(log)
    assert sorted(path.name for path in folder.iterdir()) == ["game.actions.yaml", "game.npy"]


@pytest.mark.heavy  # seconds of end-to-end waiting: keeps pytest -q under 90 s
@pytest.mark.slow
def test_closing_the_terminal_ends_the_game_as_sighup_does(tmp_path):
    """The window closed or ssh dropped while SIGHUP does not reach ardiff (`nohup`, or
    not its controlling terminal): reads see end of input, writes EIO. Exit 130."""
    steps = [Wait("frame "), Keys(b"a", 0.3), Hangup()]
    game = run_in_pty(["play", "-o", "game.npy", "--seed", "5"], steps, cwd=tmp_path,
                      timeout_s=30)
    assert game.exit_code == 130
    assert_the_game_is_kept(tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize("end", ["hangup of the controlling terminal", "SIGHUP"])
def test_a_hangup_ends_the_game_with_its_recording_kept(tmp_path, end):
    """The kernel's SIGHUP with the terminal gone (EIO on every write and on restoring
    the terminal mode), and a SIGHUP while the terminal stays."""
    last = Hangup() if end.startswith("hangup") else Signal(signal.SIGHUP)
    steps = [Wait("frame "), Keys(b"a", 0.3), last]
    game = run_in_pty(["play", "-o", "game.npy", "--seed", "5"], steps, cwd=tmp_path,
                      timeout_s=30, controlling=True)
    assert game.exit_code == 130, game.output
    assert_the_game_is_kept(tmp_path)
    if end == "SIGHUP":
        assert "error: interrupted by SIGHUP" in game.output
        assert "Traceback" not in game.output


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_while_the_script_still_imports_ends_in_exit_130(tmp_path, signum):
    """The first moments of `ardiff play`, while the script imports, before any command runs
    (PYTHONPROFILEIMPORTTIME logs each import as it ends: typer is the first after ardiff's
    own handling is installed): SIGHUP ended the process by the signal, SIGINT in a
    traceback."""
    game = run_in_pty(["play", "-o", "game.npy"], [Wait(" typer"), Signal(signum, 0.5)],
                      cwd=tmp_path, timeout_s=30, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert game.exit_code == 130, game.output
    assert f"error: interrupted by {signal.Signals(signum).name}" in game.output
    assert "Traceback" not in game.output
    assert list(tmp_path.iterdir()) == []


def test_keys_of_one_tick_make_the_chord_a_pipeline_takes():
    """Matrix-Game's universal space: W A S D and the camera (I J K L, or the arrows); the
    keys typed in one tick are held together."""
    from ardiff.pipelines.matrix_game.actions import SPACES

    space = SPACES["universal"]
    keys = ScriptedKeys(["w", "right"], ["i", "k"], ["a"], [])
    pacer = Pacer(keys, key_map(PlayConfig(), space.names, space.play_keys), fps=1000.0)
    assert pacer.choose(0) == ("w+l",)    # forward while turning right (the arrow is L)
    assert pacer.choose(1) == ("k",)      # up and down together: no such chord, the last
    assert pacer.choose(2) == ("a",)
    assert pacer.choose(3) == ("idle",)

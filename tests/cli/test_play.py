"""`ardiff play`: refused cleanly where it cannot run; played through a pseudo-terminal with
scripted keys, its action log replays frame for frame with `ardiff rollout --actions`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from pty_driver import Keys, Wait, run_in_pty

from ardiff.config.play import PlayConfig, key_map
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
    assert result.stderr.strip() == (f"error: --actions-out: the folder of '{log}' does not "
                                     f"exist; create it or choose another path")


def test_the_key_map_printed_at_start():
    assert describe_keys(key_map(PlayConfig(), WORLD)) == (
        "(no key) none · ←/a left · →/d right · ↑/w up · ↓/s down · q/Ctrl-C quit")


class ScriptedKeys:
    """Each read returns the next list of keys."""

    def __init__(self, *reads: list[str]) -> None:
        self.reads = list(reads)

    def read(self, timeout_s: float) -> list[str]:
        return self.reads.pop(0) if self.reads else []


def test_a_tick_takes_the_last_mapped_key_or_the_idle_action():
    keys = ScriptedKeys(["a", "x", "d"], [], ["w"], ["q"])
    pacer = Pacer(keys, key_map(PlayConfig(), WORLD), fps=1000.0)
    assert pacer.choose(0) == ("right",)   # a then d: the last one; x maps to nothing
    assert pacer.choose(1) == ("none",)    # no key: idle
    assert pacer.choose(2) == ("up",)
    assert pacer.choose(3) is None and pacer.quit


@pytest.mark.slow
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

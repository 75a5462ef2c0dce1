"""A steered rollout (ardiff.rollout.live): the actions chosen block by block are the ones
the pipeline got, and the log they leave replays to the same frames through
`rollout.actions` (the trained world model, whose frames follow its actions)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ardiff.config.run import load_config
from ardiff.errors import ConfigError, OutputPathError
from ardiff.rollout.inputs import read_actions
from ardiff.rollout.job import run_rollout
from ardiff.rollout.live import LiveBlocks, pipeline_actions, write_action_log

SCRIPT = ["none", "left", "left", "up", "right", "down", "down", "none", "right"]


def world(tmp_path, name: str, *overrides: str):
    return load_config(None, [f"output.path={tmp_path / name}", "rollout.frames=40",
                              *overrides])


def test_a_played_log_replays_to_the_same_frames(tmp_path):
    blocks = LiveBlocks(lambda i: (SCRIPT[i],) if i < len(SCRIPT) else None)
    played = run_rollout(world(tmp_path, "played.npy"), blocks=blocks)
    assert played.status == "ok" and played.frames_written == len(SCRIPT)
    assert blocks.log == [(action,) for action in SCRIPT]
    log = tmp_path / "played.actions.yaml"
    write_action_log(log, blocks.log, ["a comment"])
    assert log.read_text().startswith("# a comment\nactions:\n- none\n- left\n")
    replay = run_rollout(world(tmp_path, "replay.npy", f"rollout.actions={log}",
                               f"rollout.frames={len(SCRIPT)}"))
    assert replay.status == "ok"
    frames = np.load(tmp_path / "played.npy")
    assert np.array_equal(frames, np.load(tmp_path / "replay.npy"))
    # The actions steer: the same world without them is another video.
    idle = run_rollout(world(tmp_path, "idle.npy", "rollout.actions=[none]",
                             f"rollout.frames={len(SCRIPT)}"))
    assert idle.status == "ok"
    assert not np.array_equal(frames, np.load(tmp_path / "idle.npy"))


def test_the_stream_stops_at_its_frames_whatever_is_chosen(tmp_path):
    blocks = LiveBlocks(lambda i: ("left",))
    report = run_rollout(world(tmp_path, "capped.npy", "rollout.frames=5"), blocks=blocks)
    assert report.frames_written == 5 and len(blocks.log) == 5


def test_multi_frame_entries_are_written_as_lists(tmp_path):
    log = tmp_path / "log.yaml"
    write_action_log(log, [("left",), ("up", "none")])
    assert read_actions(str(log), tmp_path) == (("left",), ("up", "none"))


def test_an_unwritable_log_is_an_output_path_error(tmp_path):
    with pytest.raises(OutputPathError, match="--actions-out: cannot write"):
        write_action_log(tmp_path / "missing" / "log.yaml", [("left",)])


@pytest.mark.parametrize("names, expected", [(None, None), (("a", "b"), ("a", "b")),
                                             (["a"], ("a",))])
def test_pipeline_actions(names, expected):
    assert pipeline_actions(SimpleNamespace(action_names=names)) == expected


@pytest.mark.parametrize("names", ["left", (), ("left", ""), ("left", 3)])
def test_malformed_action_names_are_refused(names):
    with pytest.raises(ConfigError) as error:
        pipeline_actions(SimpleNamespace(action_names=names))
    assert str(error.value) == (f"pipeline: action_names is {names!r}; it must be a non-empty "
                                f"tuple of action names like ('none', 'left'), or leave it "
                                f"undefined")

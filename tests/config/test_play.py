"""The `play` section: default keys from the pipeline's actions, custom keys, and the
one-line errors for a key or an action that cannot be."""

from __future__ import annotations

import pytest

from ardiff.config.play import PlayConfig, key_map
from ardiff.config.run import build_config
from ardiff.errors import ConfigError

WORLD = ("none", "left", "right", "up", "down")
BASE = {"pipeline": {"entry": "ardiff.pipelines.bouncing:BouncingWorld"}}


def play_config(section: dict) -> PlayConfig:
    return build_config({**BASE, "play": section}).play


def test_default_keys_are_arrows_and_wasd_and_the_first_action_is_idle():
    keys = key_map(PlayConfig(), WORLD)
    assert keys.idle == "none"
    assert keys.keys == {"left": "left", "a": "left", "right": "right", "d": "right",
                         "up": "up", "w": "up", "down": "down", "s": "down"}
    assert keys.action_for("x") is None


def test_other_actions_get_digits_in_order():
    keys = key_map(PlayConfig(), ("idle", "jump", "left", "fire"))
    assert keys.keys_of("jump") == ["1"] and keys.keys_of("fire") == ["2"]
    assert keys.keys_of("idle") == []


def test_keys_and_idle_from_yaml_replace_the_defaults():
    keys = key_map(play_config({"keys": {"left": ["j", "left"], "up": ["space"]},
                                "idle": "down"}), WORLD)
    assert keys.keys == {"j": "left", "left": "left", "space": "up"} and keys.idle == "down"


@pytest.mark.parametrize("section, message", [
    ({"keys": {"left": ["q"]}}, "play.keys: 'q' is reserved: it ends ardiff play; choose "
                                "another key"),
    ({"keys": {"left": ["pgup"]}}, "play.keys: 'pgup' is not a key; use one of up, down, "
                                   "left, right, space, enter, tab or one printable character"),
    ({"keys": {"left": ["a"], "right": ["a"]}}, "play.keys: key 'a' chooses both 'left' and "
                                                "'right'; give each key one action"),
    ({"idel": "none"}, "play.idel: unknown key; did you mean 'idle'?"),
])
def test_a_bad_play_section_is_one_line(section, message):
    with pytest.raises(ConfigError) as error:
        play_config(section)
    assert str(error.value) == message


@pytest.mark.parametrize("section, message", [
    ({"keys": {"jump": ["j"]}}, "play.keys.jump: 'jump' is not an action of this pipeline; "
                                "use one of none, left, right, up, down"),
    ({"idle": "wait"}, "play.idle: 'wait' is not an action of this pipeline; use one of none, "
                       "left, right, up, down"),
])
def test_an_action_the_pipeline_lacks_is_named(section, message):
    with pytest.raises(ConfigError) as error:
        key_map(play_config(section), WORLD)
    assert str(error.value) == message

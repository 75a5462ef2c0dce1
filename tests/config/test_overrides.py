"""`--set a.b.c=value` overrides (ardiff/config/run.py::apply_override): nested keys, YAML
values, validation like the file's, and every malformed override with its message."""

from __future__ import annotations

import pytest
from config_support import MINIMAL, build, raises, with_section

from ardiff.config.run import apply_override, load_config
from ardiff.sizes import MemoryBudget


def test_overrides_apply_to_nested_keys_and_parse_values_as_yaml(write_config):
    path = write_config("""
        pipeline: {entry: 'a:b'}
        runtime: {dtype: float32, kv: {window_frames: 5}}
    """)
    config = load_config(path, ["runtime.kv.window_frames=12", "runtime.dtype=bfloat16",
                                "runtime.kv.poison=true", "runtime.memory_budget=6GiB",
                                "rollout.prompt=a cat", "pipeline.args.sizes=[1, 2]",
                                'rollout.negative_prompt="blur: heavy"'])
    assert config.runtime.kv.window_frames == 12
    assert config.runtime.dtype == "bfloat16"
    assert config.runtime.kv.poison is True
    assert config.runtime.memory_budget == MemoryBudget(num_bytes=6 * 2**30)
    assert config.rollout.prompt == "a cat"
    assert config.pipeline.args == {"sizes": [1, 2]}
    assert config.rollout.negative_prompt == "blur: heavy"  # quoted: a colon stays text


def test_overrides_create_missing_sections():
    config = build(MINIMAL, ["rollout.seed=3", "runtime.kv.sink_frames=0",
                             "pipeline.args.model.depth=2"])
    assert config.rollout.seed == 3
    assert config.runtime.kv.sink_frames == 0
    assert config.pipeline.args == {"model": {"depth": 2}}


def test_later_overrides_win_and_the_input_is_not_changed():
    data = {"pipeline": {"entry": "a:b", "args": {"x": 1}}}
    config = build(data, ["pipeline.args.x=2", "pipeline.args.x=3"])
    assert config.pipeline.args == {"x": 3}
    assert data == {"pipeline": {"entry": "a:b", "args": {"x": 1}}}


def test_override_of_a_null_section():
    assert build({**MINIMAL, "runtime": None}, ["runtime.dtype=float16"]).runtime.dtype == "float16"


def test_override_with_an_empty_value_is_an_empty_string():
    assert build(MINIMAL, ["rollout.prompt="]).rollout.prompt == ""


def test_override_of_an_unknown_key_suggests_the_right_one():
    with raises("runtime.kv.windw_frames: unknown key; did you mean 'window_frames'?"):
        build(MINIMAL, ["runtime.kv.windw_frames=3"])


def test_override_values_are_validated_like_yaml():
    with raises("runtime.kv.window_frames: expected an integer, got 'many' (str)"):
        build(MINIMAL, ["runtime.kv.window_frames=many"])


@pytest.mark.parametrize("override", ["novalue", "=3", " =3", "runtime..dtype=x", ".dtype=x",
                                      "runtime.=x"])
def test_malformed_overrides(override):
    with raises(f"--set: {override!r} is not KEY=VALUE; write e.g. "
                f"--set runtime.kv.window_frames=12"):
        apply_override({}, override)


def test_override_under_a_scalar():
    with raises("--set runtime.dtype.bits: runtime.dtype is a value, not a section; "
                "it cannot hold 'bits'"):
        build(with_section("runtime", {"dtype": "float32"}), ["runtime.dtype.bits=16"])
    with raises("--set pipeline.entry.x.y: pipeline.entry is a value, not a section; "
                "it cannot hold 'x'"):
        build(MINIMAL, ["pipeline.entry.x.y=1"])

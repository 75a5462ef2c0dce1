"""ardiff/config/run.py and ardiff/config/schema.py: typed sections, defaults, errors that name
the path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from config_support import MINIMAL, build, raises, with_section

from ardiff.config.run import KVConfig, PromptSwitch, RuntimeConfig, load_config, with_base_dir
from ardiff.sizes import MemoryBudget

# ---- defaults and a full config ------------------------------------------------------------

def test_minimal_config_gets_every_default():
    config = build()
    assert config.pipeline.entry == "pkg.mod:Pipe" and config.pipeline.args == {}
    runtime = config.runtime
    assert (runtime.device, runtime.dtype) == ("cpu", "auto")  # resolved with the device
    assert runtime.memory_budget == MemoryBudget(fraction=0.8)
    assert runtime.max_sessions is None
    assert runtime.kv == KVConfig(backend="paged", window_frames=None, sink_frames=None,
                                  page_tokens=None, poison=False)
    assert config.warmup.enabled is True
    assert (config.rollout.frames, config.rollout.seed, config.rollout.num_steps) == (48, 0, None)
    assert (config.output.path, config.output.fps) == ("ardiff_out.mp4", 16.0)


def test_full_config_from_yaml(write_config):
    path = write_config("""
        pipeline:
          entry: models/tiny.py:Tiny
          args: {width: 64, cfg: true}
        runtime:
          device: cuda:1
          dtype: bfloat16
          memory_budget: 6GiB
          max_sessions: 2
          kv: {backend: dense, window_frames: 12, sink_frames: 0, page_tokens: 16, poison: true}
        warmup: {enabled: false}
        rollout: {frames: 24, seed: 7, prompt: a cat, negative_prompt: blur, num_steps: 4,
                  guidance_scale: 3}
        output: {path: out.gif, fps: 8}
    """, name="sub/run.yaml")
    config = load_config(path)
    assert config.pipeline.args == {"width": 64, "cfg": True}
    assert config.runtime == RuntimeConfig(
        device="cuda:1", dtype="bfloat16", memory_budget=MemoryBudget(num_bytes=6 * 2**30),
        max_sessions=2, kv=KVConfig("dense", 12, 0, 16, True))
    assert config.runtime.dtype_bytes == 2
    assert config.warmup.enabled is False
    assert config.rollout.guidance_scale == 3.0 and isinstance(config.rollout.guidance_scale, float)
    assert (config.output.path, config.output.fps) == ("out.gif", 8.0)
    assert config.base_dir == path.parent.resolve()


def test_configs_are_frozen():
    config = build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.runtime = RuntimeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.runtime.kv.window_frames = 3


# ---- unknown and missing keys --------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    ({**MINIMAL, "runtim": {}}, "runtim: unknown key; did you mean 'runtime'?"),
    (with_section("runtime", {"dtyp": "float32"}),
     "runtime.dtyp: unknown key; did you mean 'dtype'?"),
    (with_section("runtime", {"kv": {"windw_frames": 3}}),
     "runtime.kv.windw_frames: unknown key; did you mean 'window_frames'?"),
    ({"pipeline": {"entry": "a:b", "arg": {}}}, "pipeline.arg: unknown key; did you mean 'args'?"),
])
def test_unknown_keys_name_the_dotted_path_and_suggest(data, message):
    with raises(message):
        build(data)


def test_unknown_key_without_a_close_match_lists_the_known_keys():
    with raises("output.zzz: unknown key; known keys: path, fps"):
        build(with_section("output", {"zzz": 1}))


def test_unknown_keys_come_before_the_values_of_their_section():
    """A typo'd key is read before the values beside it and under it, as the file is read."""
    with raises("rollout.frams: unknown key; did you mean 'frames'?"):
        build(with_section("rollout", {"seed": "x", "frams": 1}))
    with raises("runtim: unknown key; did you mean 'runtime'?"):
        build({**MINIMAL, "runtime": {"dtype": "fp32"}, "runtim": {}})
    with raises("runtime.dtyp: unknown key; did you mean 'dtype'?"):
        build(with_section("runtime", {"kv": {"windw_frames": 3}, "dtyp": 1}))


def test_a_key_that_is_not_text_is_unknown():
    with raises("1: unknown key; known keys: pipeline, runtime, warmup, rollout, output, play"):
        build({**MINIMAL, 1: {}})
    with raises("base_dir: unknown key"):  # set from the file's folder, never from its text
        build({**MINIMAL, "base_dir": "/tmp"})


def test_pipeline_args_accept_any_keys():
    assert build({"pipeline": {"entry": "a:b", "args": {"anything": [1, 2]}}}).pipeline.args == {
        "anything": [1, 2]}


def test_missing_required_keys():
    with raises("pipeline: required key is missing"):
        build({})
    with raises("pipeline.entry: required key is missing"):
        build({"pipeline": {}})


def test_an_empty_section_means_all_defaults():
    assert build({**MINIMAL, "runtime": None}).runtime == RuntimeConfig()


# ---- wrong types ---------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    (with_section("runtime", {"kv": {"window_frames": "12"}}),
     "runtime.kv.window_frames: expected an integer, got '12' (str)"),
    (with_section("runtime", {"max_sessions": 1.0}),
     "runtime.max_sessions: expected an integer, got 1.0 (float)"),
    (with_section("rollout", {"frames": True}),
     "rollout.frames: expected an integer, got True (bool)"),
    (with_section("runtime", {"kv": {"poison": 1}}),
     "runtime.kv.poison: expected true or false, got 1 (int)"),
    (with_section("output", {"fps": "fast"}), "output.fps: expected a number, got 'fast' (str)"),
    (with_section("rollout", {"prompt": 5}), "rollout.prompt: expected a string, got 5 (int)"),
    (with_section("rollout", {"prompt": ["a"]}), "rollout.prompt: expected a string, got a list"),
    (with_section("runtime", {"device": None}),
     "runtime.device: expected a string, got nothing (null)"),
    (with_section("runtime", [1]), "runtime: expected a mapping of keys, got a list"),
    (with_section("runtime", {"kv": 3}), "runtime.kv: expected a mapping of keys, got 3 (int)"),
    ({"pipeline": {"entry": "a:b", "args": [1]}}, "pipeline.args: expected a mapping, got a list"),
    (with_section("runtime", {"memory_budget": "lots"}),
     "runtime.memory_budget: 'lots' is not a size"),
])
def test_wrong_types_name_path_expected_type_and_value(data, message):
    with raises(message):
        build(data)


@pytest.mark.parametrize("runtime, message", [
    ({"dtype": "fp32"},
     "runtime.dtype: 'fp32' (str) is not allowed; use one of 'auto', 'float32', 'bfloat16', "
     "'float16'"),
    ({"kv": {"backend": "flash"}},
     "runtime.kv.backend: 'flash' (str) is not allowed; use one of 'paged', 'dense'"),
])
def test_literal_values(runtime, message):
    with raises(message):
        build(with_section("runtime", runtime))


@pytest.mark.parametrize("dtype, num_bytes", [("float32", 4), ("bfloat16", 2), ("float16", 2)])
def test_dtype_bytes(dtype, num_bytes):
    assert build(with_section("runtime", {"dtype": dtype})).runtime.dtype_bytes == num_bytes


def test_auto_dtype_has_no_bytes_until_resolved():
    with pytest.raises(ValueError, match="runtime.dtype is auto: resolve it with the device"):
        build().runtime.dtype_bytes


# ---- value rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "auto", "cuda", "cuda:0", "cuda:12"])
def test_valid_devices(device):
    assert build(with_section("runtime", {"device": device})).runtime.device == device


@pytest.mark.parametrize("device", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", ""])
def test_invalid_devices(device):
    with raises(f"runtime.device: {device!r} is not a device; use cpu, cuda, cuda:N or auto"):
        build(with_section("runtime", {"device": device}))


@pytest.mark.parametrize("section, values, message", [
    ("runtime", {"kv": {"window_frames": 0}},
     "runtime.kv.window_frames: 0 is invalid; it must be > 0"),
    ("runtime", {"kv": {"sink_frames": -1}},
     "runtime.kv.sink_frames: -1 is invalid; it must be >= 0"),
    ("runtime", {"kv": {"page_tokens": 0}},
     "runtime.kv.page_tokens: 0 is invalid; it must be > 0"),
    ("runtime", {"max_sessions": 0}, "runtime.max_sessions: 0 is invalid; it must be > 0"),
    ("rollout", {"frames": 0}, "rollout.frames: 0 is invalid; it must be > 0"),
    ("rollout", {"num_steps": -2}, "rollout.num_steps: -2 is invalid; it must be > 0"),
    ("output", {"fps": 0}, "output.fps: 0.0 must be > 0; try 16"),
])
def test_minimums(section, values, message):
    with raises(message):
        build(with_section(section, values))


def test_sink_override_of_zero_is_kept():
    assert build(with_section("runtime", {"kv": {"sink_frames": 0}})).runtime.kv.sink_frames == 0


@pytest.mark.parametrize("value, budget", [
    ("6GiB", MemoryBudget(num_bytes=6 * 2**30)),
    ("512MiB", MemoryBudget(num_bytes=512 * 2**20)),
    ("1.5GB", MemoryBudget(num_bytes=1_500_000_000)),
    (4096, MemoryBudget(num_bytes=4096)),
    (0.8, MemoryBudget(fraction=0.8)),
])
def test_memory_budget_values(write_config, value, budget):
    path = write_config(f"pipeline: {{entry: 'a:b'}}\nruntime: {{memory_budget: {value}}}\n")
    assert load_config(path).runtime.memory_budget == budget


@pytest.mark.parametrize("value, message", [
    ("0", "runtime.memory_budget: 0 must be more than 0 bytes"),
    ("-1GiB", "runtime.memory_budget: '-1GiB' is not a size"),
    ("-5", "runtime.memory_budget: -5 must be more than 0 bytes"),
    ("6XB", "runtime.memory_budget: '6XB' has unknown unit 'XB'"),
    ("1.5", "runtime.memory_budget: 1.5 is neither a fraction in (0, 1] nor a whole number"),
])
def test_bad_memory_budgets(write_config, value, message):
    path = write_config(f"pipeline: {{entry: 'a:b'}}\nruntime: {{memory_budget: {value}}}\n")
    with raises(message):
        load_config(path)


# ---- prompt schedules ----------------------------------------------------------------------

def test_a_prompt_schedule_becomes_prompt_switches():
    config = build(with_section("rollout", {"prompt": [
        {"frame": 0, "prompt": "a"}, {"frame": 8, "prompt": "b", "on_switch": "reset"}]}))
    assert config.rollout.prompt == [PromptSwitch(0, "a"), PromptSwitch(8, "b", "reset")]


@pytest.mark.parametrize("rollout, message", [
    ({"prompt": []}, "rollout.prompt: a schedule must start at frame 0, got frames []; "
                     "add {frame: 0, prompt: ...} first"),
    ({"prompt": [{"frame": 0, "prompt": "a"}, {"frame": 0, "prompt": "b"}]},
     "rollout.prompt: schedule frames [0, 0] must increase strictly"),
    ({"prompt": [{"frame": 0, "prompt": "a"}], "prompts": ["b"]},
     "rollout.prompts: cannot be combined with a rollout.prompt schedule; use one or the other"),
    # A list of mappings is a schedule: a rule broken inside it says more than "not text".
    ({"prompt": [{"frame": -1, "prompt": "a"}]},
     "rollout.prompt[0].frame: -1 is invalid; it must be >= 0"),
    # A prompt is text first: a list that is not a schedule is reported as not text.
    ({"prompt": [1, 2]}, "rollout.prompt: expected a string, got a list"),
    ({"prompts": 5}, "rollout.prompts: expected a list, got 5 (int)"),
    ({"actions": ["left", 3]}, "rollout.actions[1]: expected a string, got 3 (int)"),
    # Inside a schedule entry (a mapping) or a block's action list, the problem is named
    # where it is, not as "not a string".
    ({"prompt": [{"frame": 0, "prompt": "a"}, {"frame": 3, "promt": "b"}]},
     "rollout.prompt[1].promt: unknown key; did you mean 'prompt'?"),
    ({"prompt": [{"frame": 0, "prompt": "a"}, {"frame": 3, "prompt": "b", "on_switch": "rest"}]},
     "rollout.prompt[1].on_switch: 'rest' (str) is not allowed; use one of 'keep', "
     "'clear-cross', 'reset', 'recache'"),
    ({"prompt": [{"frame": 0, "prompt": "a"}, {"frame": "x", "prompt": "b"}]},
     "rollout.prompt[1].frame: expected an integer, got 'x' (str)"),
    ({"actions": [["left", 3]]}, "rollout.actions[0][1]: expected a string, got 3 (int)"),
])
def test_bad_schedules_and_lists(rollout, message):
    with raises(message):
        build(with_section("rollout", rollout))


# ---- files ---------------------------------------------------------------------------------

def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with raises(f"config: {str(missing)!r} does not exist or is not a file; check the path"):
        load_config(missing)
    with raises(f"config: {str(tmp_path)!r} does not exist or is not a file"):
        load_config(tmp_path)


def test_yaml_syntax_error_names_line_and_column(write_config):
    path = write_config("pipeline:\n  entry: a:b\nruntime:\n  dtype: bfloat16\n bad: 1\n")
    with raises(f"{path}: YAML syntax error at line 5, column 2: expected <block end>"):
        load_config(path)


def test_top_level_must_be_a_mapping(write_config):
    path = write_config("- pipeline\n- runtime\n")
    with raises(f"{path}: the top level must be a mapping of sections (pipeline, runtime, ...), "
                f"got list"):
        load_config(path)


def test_empty_file_needs_a_pipeline(write_config):
    with raises("pipeline: required key is missing"):
        load_config(write_config(""))


def test_base_dir_is_the_config_files_folder(write_config, tmp_path, monkeypatch):
    write_config("pipeline: {entry: 'x.py:X'}\n", name="deep/er/run.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_config(Path("deep/er/run.yaml")).base_dir == (tmp_path / "deep/er").resolve()
    assert build().base_dir == Path(".")


def test_base_dir_does_not_affect_equality(write_config):
    path = write_config("pipeline: {entry: 'a:b'}\n")
    assert load_config(path) == build({"pipeline": {"entry": "a:b"}})


def test_a_replaced_config_is_validated_and_keeps_its_folder(write_config):
    config = load_config(write_config("pipeline: {entry: 'a:b'}\n", name="sub/run.yaml"))
    runtime = dataclasses.replace(config.runtime, max_sessions=1)
    replaced = with_base_dir(dataclasses.replace(config, runtime=runtime), config.base_dir)
    assert replaced.runtime.max_sessions == 1 and replaced.base_dir == config.base_dir
    assert config.runtime.max_sessions is None  # the original is unchanged
    with pytest.raises(ValueError, match="max_sessions"):
        dataclasses.replace(config.runtime, max_sessions=0)


def test_the_embedded_default_is_configs_default_yaml():
    """`ardiff rollout` with no config reads the packaged copy of configs/default.yaml:
    the trained world model, a scripted action path, an mp4."""
    embedded = load_config(None)
    on_disk = load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    assert embedded == on_disk
    assert embedded.pipeline.entry == "ardiff.pipelines.bouncing:BouncingWorld"
    assert embedded.output.path.endswith(".mp4") and embedded.rollout.actions

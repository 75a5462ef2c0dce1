"""ardiff/config/yaml_loader.py: YAML without duplicate keys, alias bombs or recursion, for
run configs, `--set` values and actions files alike."""

from __future__ import annotations

import re
import textwrap

import pytest
import yaml

from ardiff.config import yaml_loader
from ardiff.config.run import build_config, load_config
from ardiff.config.yaml_loader import MAX_ALIAS_NODES, MAX_DEPTH, safe_load
from ardiff.errors import ConfigError
from ardiff.rollout.inputs import read_actions


def load(text: str):
    return safe_load(textwrap.dedent(text), "run.yaml")


def raises(message: str):
    return pytest.raises(ConfigError, match="^" + re.escape(message))


def bomb(levels: int = 9) -> str:
    """A "billion laughs": each level is nine aliases of the one before (9**(levels+1))."""
    lines = ['l0: &l0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]']
    lines += [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


# ---- duplicate keys ------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: 2\na: 3\n", "run.yaml: key 'a' appears twice, at line 1 and line 3; keep one "
                           "of them"),
    ("rollout:\n  frames: 4\n  seed: 1\n  frames: 8\n",
     "run.yaml: key 'rollout.frames' appears twice, at line 2 and line 4; keep one of them"),
    ("x: {a: 1, a: 2}\n", "run.yaml: key 'x.a' appears twice, on line 1 (columns 5 and 11); "
                          "keep one of them"),
    ('"a": 1\na: 2\n', "run.yaml: key 'a' appears twice, at line 1 and line 2"),  # quoted or not
    ("p:\n  - {frame: 0, frame: 8}\n", "run.yaml: key 'p[0].frame' appears twice, on line 2"),
])
def test_a_key_written_twice_is_refused_with_both_lines(text, message):
    with raises(message):
        load(text)


def test_merge_keys_may_override_their_base():
    assert load("""
        base: &base {frames: 4, seed: 1}
        run: {<<: *base, seed: 2}
    """)["run"] == {"frames": 4, "seed": 2}


def test_a_duplicate_key_in_a_run_config_file(write_config):
    path = write_config("pipeline: {entry: 'a:b'}\nrollout:\n  frames: 4\n  frames: 8\n")
    with raises(f"{path}: key 'rollout.frames' appears twice, at line 3 and line 4; keep one"):
        load_config(path)


# ---- aliases -------------------------------------------------------------------------------

def test_an_alias_bomb_is_refused_before_anything_is_built():
    text = bomb()
    assert len(text) < 500
    with raises(f"run.yaml: its aliases expand to more than {MAX_ALIAS_NODES:,} values; use "
                f"fewer aliases (or write the values out)"):
        load(text)


def test_aliases_within_the_budget_are_fine():
    data = load(bomb(levels=3))  # 9**4 + 9**3 + ... values: a few thousand
    assert data["l3"][8][8][8] == ["lol"] * 9
    data = load("defaults: &d {fps: 16}\nfirst: *d\nsecond: *d\n")
    assert data["first"] == data["second"] == {"fps": 16}


def test_a_long_document_without_aliases_is_never_refused_for_its_size(monkeypatch):
    monkeypatch.setattr(yaml_loader, "MAX_ALIAS_NODES", 50)
    text = "actions: [" + ", ".join(["left"] * 200) + "]\n"
    assert len(load(text)["actions"]) == 200
    with raises("run.yaml: its aliases expand to more than 50 values"):
        load("a: &a [" + ", ".join(["x"] * 30) + "]\nb: [*a, *a]\n")


@pytest.mark.parametrize("text, message", [
    ("a: &a [1, *a]\n", "run.yaml: the value at line 1 contains itself through an alias; a "
                        "config cannot be recursive"),
    ("a: &a {self: *a}\n", "run.yaml: the value at line 1 contains itself"),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"run.yaml: nests deeper than {MAX_DEPTH} "
                                                    f"levels at line 1; flatten it"),
    ("[" * 1500 + "]" * 1500, f"run.yaml: nests deeper than {MAX_DEPTH} levels at line 1; "
                                    f"flatten it"),  # once Python's recursion limit
    ("a: &a " + "[" * 60 + "1" + "]" * 60 + "\nb: " + "[" * 60 + "*a" + "]" * 60 + "\n",
     f"run.yaml: its aliases nest values deeper than {MAX_DEPTH} levels; flatten it"),
])
def test_recursion_and_deep_nesting_are_refused(text, message):
    with raises(message):
        load(text)


# ---- what PyYAML would crash on --------------------------------------------------------------

def test_an_integer_too_long_for_python_is_a_yaml_error():
    with pytest.raises(yaml.MarkedYAMLError, match=r"the integer 9+\.\.\.9+ has 5000 digits, "
                                                   r"too many"):
        load("frames: " + "9" * 5000 + "\n")


def test_a_control_character_is_a_syntax_error_at_its_place(write_config):
    path = write_config('pipeline: {entry: "a:b"}\nrollout:\n  prompt: "a\x07"\n')
    with raises(f"{path}: YAML syntax error at line 3, column 13: character #x0007 is not "
                f"allowed in YAML (a control character); fix the YAML there"):
        load_config(path)



# ---- #25: what PyYAML reads differently from JSON, and sets ------------------------------------

def test_an_escaped_surrogate_pair_is_the_character_it_encodes():
    """JSON writes U+1F600 as the pair \\ud83d\\ude00 (so do the command-line flags); PyYAML
    read each half as a lone surrogate, which no text may hold."""
    assert load('a: "\\ud83d\\ude00 ok"\n"k\\ud83d\\ude00": 1\n') == {"a": "\U0001F600 ok",
                                                                   "k\U0001F600": 1}
    assert load('a: "\\udcff"\n') == {"a": "\udcff"}  # a lone one stays: the config refuses it
    assert load('a: "\\ude00\\ud83d"\n') == {"a": "\ude00\ud83d"}  # halves out of order


@pytest.mark.parametrize("text, line", [("prompts: !!set {b, a}\n", 1),
                                        ("x:\n  y: !!set\n    ? a\n", 2)])
def test_a_set_is_refused_it_has_no_order(text, line):
    with raises(f"run.yaml: the set (!!set) at line {line} has no order; write a list such as "
                f"[a, b] instead"):
        load(text)


# ---- the other readers use it ----------------------------------------------------------------

def test_set_values_are_read_with_the_same_limits():
    with raises("--set pipeline.args.x: key 'a' appears twice, on line 1 (columns 2 and 8)"):
        build_config({"pipeline": {"entry": "a:b"}}, ["pipeline.args.x={a: 1, a: 2}"])
    laughs = bomb().replace("\n", ", ").rstrip(", ")
    with raises("--set pipeline.args.x: its aliases expand to more than"):
        build_config({"pipeline": {"entry": "a:b"}}, ["pipeline.args.x={" + laughs + "}"])


def test_an_actions_file_is_read_with_the_same_limits(tmp_path):
    (tmp_path / "actions.yaml").write_text("actions: [left]\nactions: [right]\n")
    with raises(f"rollout.actions ({tmp_path / 'actions.yaml'}): key 'actions' appears twice, "
                f"at line 1 and line 2; keep one of them"):
        read_actions("actions.yaml", tmp_path)
    (tmp_path / "actions.yaml").write_text(bomb())
    with raises(f"rollout.actions ({tmp_path / 'actions.yaml'}): its aliases expand"):
        read_actions("actions.yaml", tmp_path)

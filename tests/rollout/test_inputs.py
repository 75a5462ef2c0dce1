"""ardiff/rollout/inputs.py: prompts and actions files are held to the rules of inline
values, actions to the pipeline's names, prompts to its text length (a warning)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ardiff.config.run import build_config
from ardiff.contract.inputs import PipelineInputs
from ardiff.errors import ConfigError
from ardiff.pipelines.tiny_dit.pipeline import TinyCausalDiT
from ardiff.pipelines.tiny_dit.text import tokenize
from ardiff.rollout.inputs import (
    ignored_prompt_warnings,
    prompt_warnings,
    read_actions,
    read_prompts,
)
from ardiff.rollout.streams import RolloutPlan, Stream

NAMES = ("none", "left", "right")


def raises(message: str):
    return pytest.raises(ConfigError, match="^" + re.escape(message) + "$")


def test_a_bom_is_dropped_and_lines_are_numbered_in_errors(tmp_path):
    (tmp_path / "p.txt").write_bytes("\ufeff# comment\na cat\n\n  a dog  \n".encode())
    assert read_prompts("p.txt", tmp_path) == ["a cat", "a dog"]

    (tmp_path / "p.txt").write_text("a cat\n\na \udcff dog\n", errors="surrogatepass")
    with pytest.raises(ConfigError):  # not UTF-8: refused by the decoder already
        read_prompts("p.txt", tmp_path)
    (tmp_path / "p.txt").write_text("a cat\n\n\ta\0dog\n")
    with raises(f"rollout.prompts ({tmp_path / 'p.txt'}) line 3: 'a\\x00dog' holds a NUL "
                f"character at character 1; remove it"):
        read_prompts("p.txt", tmp_path)


@pytest.mark.parametrize("text, where, quoted, problem", [
    ('- left\n- "ri\\0ght"\n', "[1]", "'ri\\x00ght'", "holds a NUL character at character 2; "
                                                     "remove it"),
    ('- [left, "\\udcff"]\n', "[0]", "'\\udcff'", "is not valid Unicode (a lone surrogate "
     "'\\udcff' at character 0: bytes that are not UTF-8?); write it in UTF-8"),
])
def test_an_actions_file_holds_text_as_inline_actions_do(tmp_path, text, where, quoted, problem):
    (tmp_path / "a.yaml").write_text(text)
    with raises(f"rollout.actions ({tmp_path / 'a.yaml'}){where}: {quoted} {problem}"):
        read_actions("a.yaml", tmp_path)


def test_the_inline_value_says_the_same(tmp_path):
    with pytest.raises(Exception, match=re.escape("'ri\\x00ght' holds a NUL character at "
                                                  "character 2; remove it")):
        build_config({"pipeline": {"entry": "a:b"}, "rollout": {"actions": ["ri\0ght"]}})


def test_actions_are_held_to_the_pipelines_names_and_block(tmp_path):
    assert read_actions(["left", ["none", "right"]], tmp_path, NAMES, 2) == (
        ("left",), ("none", "right"))
    with raises("rollout.actions[1]: 'jump' is not an action of this pipeline; use one of "
                "none, left, right"):
        read_actions(["left", ["none", "jump"]], tmp_path, NAMES, 2)
    with raises("rollout.actions[0]: ['left', 'left', 'left'] is 3 actions for a block of 2 "
                "frame(s); give one action for the whole block or one per frame"):
        read_actions([["left"] * 3], tmp_path, NAMES, 2)
    assert read_actions(["jump"], tmp_path) == (("jump",),)  # no names declared: any pass


def plan(*prompts: str, negative: str = "") -> RolloutPlan:
    streams = tuple(Stream(i, f"stream-{i}", (SimpleNamespace(prompt=p),), Path("o.npy"), ())
                    for i, p in enumerate(prompts))
    return RolloutPlan(streams, 4, 2, 2, None, False, 0, negative, None, 1.0)


def test_prompts_longer_than_the_text_length_are_warnings(tmp_path):
    config = build_config({"pipeline": {"entry": "a:b"}})
    words = SimpleNamespace(max_prompt_tokens=2, count_prompt_tokens=lambda p: len(p.split()))

    assert prompt_warnings(words, config, plan("a cat", "a big cat", negative="x y z")) == [
        "rollout.prompt: 'a big cat' is 3 tokens, longer than the pipeline's text length of "
        "2 tokens; the model sees only the first 2",
        "rollout.negative_prompt: 'x y z' is 3 tokens, longer than the pipeline's text length "
        "of 2 tokens; the model sees only the first 2"]
    assert prompt_warnings(SimpleNamespace(), config, plan("a big cat")) == []  # no text length
    unloaded = SimpleNamespace(max_prompt_tokens=2, count_prompt_tokens=lambda p: None)
    assert prompt_warnings(unloaded, config, plan("a big cat")) == []


def test_a_failing_count_is_a_warning_not_a_failed_run(tmp_path):
    config = build_config({"pipeline": {"entry": "a:b"}})
    broken = SimpleNamespace(max_prompt_tokens=2, count_prompt_tokens=lambda p: 1 / 0)
    assert prompt_warnings(broken, config, plan("a")) == [
        "pipeline: checking the prompts' length raised ZeroDivisionError: division by zero; "
        "they were not checked"]


def test_a_prompt_to_a_pipeline_that_ignores_prompts_is_a_warning():
    config = build_config({"pipeline": {"entry": "a:b"},
                           "rollout": {"prompt": "a cat", "negative_prompt": "blur"}})
    deaf = SimpleNamespace(ardiff_inputs=PipelineInputs(prompt="ignored"))
    assert ignored_prompt_warnings(deaf, config) == [
        "rollout.prompt: given, but this pipeline ignores prompts (its inputs declare prompt: "
        "ignored); the video does not depend on it; remove rollout.prompt",
        "rollout.negative_prompt: given, but this pipeline ignores prompts (its inputs declare "
        "prompt: ignored); the video does not depend on it; remove rollout.negative_prompt"]
    assert ignored_prompt_warnings(deaf, build_config({"pipeline": {"entry": "a:b"}})) == []
    assert ignored_prompt_warnings(SimpleNamespace(), config) == []  # declares nothing
    listening = SimpleNamespace(ardiff_inputs=PipelineInputs(prompt="accepted"))
    assert ignored_prompt_warnings(listening, config) == []


def test_tiny_dit_counts_what_its_tokenizer_keeps():
    pipeline = TinyCausalDiT(text_tokens=4)
    assert pipeline.max_prompt_tokens == 4
    assert pipeline.count_prompt_tokens("h\u00e9") == 3  # UTF-8 bytes: é is two
    kept = tokenize("h\u00e9llo", pipeline.max_prompt_tokens)
    assert kept.tolist() == [b + 1 for b in "h\u00e9l".encode()]  # the first 4 tokens

"""ardiff/engine/loader.py: the files a pipeline declares it reads (`ar_diffusion_input_paths`),
read before any work so that no output overwrites them, and every way the hook can be wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ardiff
from ardiff.engine.loader import declared_input_paths, entry_file
from ardiff.errors import PipelineLoadError


class Declares:
    def __init__(self, value):
        self.value = value

    def ar_diffusion_input_paths(self):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_a_pipeline_without_the_hook_declares_nothing():
    assert declared_input_paths(object()) == []


def test_the_base_class_declares_nothing():
    class Minimal(ardiff.ARDiffusionPipelineBase):
        def ar_diffusion_kv_cache_spec(self): ...

        def generate_block(self, request, state): ...

    assert Minimal().ar_diffusion_input_paths() == {}
    assert declared_input_paths(Minimal()) == []


def test_names_and_paths_in_order_none_skipped_tilde_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    pipeline = Declares({"pipeline.args.model_dir": "~/wan", "pipeline.args.lora": None,
                         "pipeline.args.ckpt": Path("ckpt.pt")})
    assert declared_input_paths(pipeline) == [("pipeline.args.model_dir", tmp_path / "wan"),
                                              ("pipeline.args.ckpt", Path("ckpt.pt"))]


@pytest.mark.parametrize("value, message", [
    (["wan"], "pipeline: ar_diffusion_input_paths() returned a list; it must return a mapping "
              "of names to paths, like {'pipeline.args.model_dir': 'models/wan'}"),
    ({"pipeline.args.ckpt": 3}, "pipeline: ar_diffusion_input_paths()['pipeline.args.ckpt'] is "
                                "3 (int); it must be a path (str or os.PathLike) or None"),
    ({1: "a.pt"}, "pipeline: ar_diffusion_input_paths() has the key 1 (int); its keys name "
                  "where each path comes from, like 'pipeline.args.ckpt'"),
    ({"pipeline.args.ckpt": ""}, "pipeline: ar_diffusion_input_paths()['pipeline.args.ckpt'] "
                                 "is ''; give the path the pipeline reads, or None"),
    ({"pipeline.args.ckpt": "a\0b"}, "pipeline: ar_diffusion_input_paths()['pipeline.args."
                                     "ckpt'] is 'a\\x00b', which holds a NUL byte"),
    (ValueError("boom"), "pipeline: ar_diffusion_input_paths() raised ValueError: boom"),
])
def test_a_hook_that_is_wrong_is_one_line_naming_it(value, message):
    with pytest.raises(PipelineLoadError, match=f"^{re.escape(message)}") as caught:
        declared_input_paths(Declares(value))
    assert "\n" not in str(caught.value)


def test_the_entry_file_is_the_file_of_a_file_entry_only(tmp_path):
    assert entry_file("models/pipe.py:Pipe", tmp_path) == tmp_path / "models" / "pipe.py"
    assert entry_file("/abs/pipe.py:Pipe", tmp_path) == Path("/abs/pipe.py")
    assert entry_file("package.module:Pipe", tmp_path) is None
    assert entry_file("bouncing", tmp_path) is None

"""ardiff/engine/loader.py: the three kinds of entry point, and every way building a pipeline fails."""

from __future__ import annotations

import re
import shutil
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from ardiff.config.run import PipelineConfig, load_config
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.engine import loader
from ardiff.engine.build import inspect_spec
from ardiff.engine.loader import build_pipeline, get_spec, resolve_entry
from ardiff.errors import PipelineLoadError, SpecError


def build(entry: str, base_dir=Path("."), **args):
    return build_pipeline(PipelineConfig(entry, args), base_dir)


def raises(message: str):
    return pytest.raises(PipelineLoadError, match=re.escape(message))


def write_module(directory, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(source)


# ---- the three kinds of entry point --------------------------------------------------------

def test_module_entry_builds_with_args_as_keywords():
    pipeline = build("spec_pipelines:GoodPipeline", window_frames=7)
    spec = get_spec(pipeline)
    assert isinstance(spec, ARDiffusionKVCacheSpec)
    assert spec.window_frames == 7 and spec.num_layers == 2


def test_a_factory_function_is_an_entry_too():
    pipeline = build("spec_pipelines:make_good_pipeline", branch_names=["positive", "negative"])
    assert [b.name for b in get_spec(pipeline).kv_branches] == ["positive", "negative"]


def test_file_entry_is_relative_to_the_config_files_folder(tmp_path, pipelines_file,
                                                           write_config, monkeypatch):
    shutil.copy(pipelines_file, tmp_path / "models.py")
    config = load_config(write_config("""
        pipeline:
          entry: ../models.py:GoodPipeline
          args: {sink_frames: 0}
    """, name="configs/run.yaml"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)   # the working directory plays no part
    pipeline = build_pipeline(config.pipeline, config.base_dir)
    assert get_spec(pipeline).sink_frames == 0


def test_absolute_file_entry(pipelines_file):
    assert get_spec(build(f"{pipelines_file}:GoodPipeline")).num_layers == 2


def test_two_plugin_files_with_the_same_name_do_not_clash(tmp_path):
    for folder, value in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        write_module(tmp_path / folder, "model", f"VALUE = {value}\n")
    assert resolve_entry("a/model.py:VALUE", tmp_path) == 1
    assert resolve_entry("b/model.py:VALUE", tmp_path) == 2


def fake_entry_points(*entries: tuple[str, str]):
    points = [metadata.EntryPoint(name, value, loader.ENTRY_POINT_GROUP) for name, value in entries]

    def entry_points(group: str):
        return [ep for ep in points if ep.group == group]

    return SimpleNamespace(entry_points=entry_points)


def test_registered_name(monkeypatch):
    registered = fake_entry_points(("tiny", "spec_pipelines:GoodPipeline"))
    monkeypatch.setattr(loader, "metadata", registered)
    assert get_spec(build("tiny", window_frames=3)).window_frames == 3


def test_unregistered_name(monkeypatch):
    registered = fake_entry_points(("tiny", "spec_pipelines:GoodPipeline"),
                                   ("wan", "spec_pipelines:GoodPipeline"))
    monkeypatch.setattr(loader, "metadata", registered)
    with raises("pipeline.entry: 'tinny' is not a registered pipeline (known: tiny, wan); "
                "use package.module:attr or path/file.py:attr"):
        build("tinny")


def test_unregistered_name_with_the_real_entry_points():
    with raises("pipeline.entry: 'ardiff-no-such-pipeline' is not a registered pipeline (known: "):
        build("ardiff-no-such-pipeline")


def test_registered_name_that_fails_to_load(monkeypatch):
    monkeypatch.setattr(loader, "metadata", fake_entry_points(
        ("broken", "ardiff_no_such_module_xyz:Pipe")))
    with raises("pipeline.entry: loading registered pipeline 'broken' raised "
                "ModuleNotFoundError: No module named 'ardiff_no_such_module_xyz'"):
        build("broken")


# ---- entry points that cannot be resolved --------------------------------------------------

@pytest.mark.parametrize("entry", [":GoodPipeline", "spec_pipelines:", "models.py:"])
def test_malformed_entry(entry):
    with raises(f"pipeline.entry: {entry!r} is malformed; write package.module:attr, "
                f"path/file.py:attr or a registered name"):
        build(entry)


@pytest.mark.parametrize("module", ["ardiff_no_such_module_xyz", "spec_pipelines.sub"])
def test_module_not_found(module):
    with raises(f"pipeline.entry: module {module!r} not found; check the spelling or install "
                f"the package that provides it"):
        build(f"{module}:Pipe")


def test_module_whose_own_import_is_missing(tmp_path, monkeypatch):
    write_module(tmp_path, "ardiff_test_needs_dep", "import ardiff_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with raises("pipeline.entry: importing 'ardiff_test_needs_dep' failed: "
                "No module named 'ardiff_missing_dependency_xyz'"):
        build("ardiff_test_needs_dep:Pipe")


def test_module_that_raises_on_import(tmp_path, monkeypatch):
    write_module(tmp_path, "ardiff_test_raises", "raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with raises("pipeline.entry: importing 'ardiff_test_raises' raised RuntimeError: "
                "boom at import"):
        build("ardiff_test_raises:Pipe")


def test_file_not_found(tmp_path):
    missing = tmp_path / "models" / "nope.py"
    with raises(f"pipeline.entry: file {str(missing)!r} not found (paths are relative to the "
                f"config file's folder {str(tmp_path)!r})"):
        build("models/nope.py:Pipe", tmp_path)


def test_file_that_raises_is_not_cached(tmp_path):
    write_module(tmp_path, "flaky", "VALUE = 1 / 0\n")
    with raises(f"pipeline.entry: running {str(tmp_path / 'flaky.py')!r} raised "
                f"ZeroDivisionError: division by zero"):
        resolve_entry("flaky.py:VALUE", tmp_path)
    write_module(tmp_path, "flaky", "VALUE = 1\n")   # fixed: the next load runs it again
    assert resolve_entry("flaky.py:VALUE", tmp_path) == 1


def test_attribute_missing_lists_what_the_module_defines():
    with raises("pipeline.entry: 'spec_pipelines' has no attribute 'GoodPipelin'; it defines: "):
        build("spec_pipelines:GoodPipelin")
    with pytest.raises(PipelineLoadError, match="GoodPipeline"):
        build("spec_pipelines:GoodPipelin")


def test_attribute_missing_from_a_file(pipelines_file):
    with raises(f"pipeline.entry: {str(pipelines_file)!r} has no attribute 'Nope'"):
        build(f"{pipelines_file}:Nope")


def test_entry_that_is_not_callable():
    with raises("pipeline.entry: 'spec_pipelines:NOT_CALLABLE' is a int, not a class or factory"):
        build("spec_pipelines:NOT_CALLABLE")


# ---- building and checking the pipeline ----------------------------------------------------

def test_constructor_raising_keeps_the_cause():
    with raises("pipeline: constructing 'spec_pipelines:ConstructorRaisesPipeline' with args "
                "{'width': 64} raised ValueError: no such checkpoint: "
                "/nowhere.safetensors") as info:
        build("spec_pipelines:ConstructorRaisesPipeline", width=64)
    assert isinstance(info.value.__cause__, ValueError)


def test_constructor_given_an_unknown_arg():
    with raises("pipeline: constructing 'spec_pipelines:MissingMethodsPipeline' with args "
                "{'bogus': 1} raised TypeError: MissingMethodsPipeline() takes no arguments"):
        build("spec_pipelines:MissingMethodsPipeline", bogus=1)


def test_missing_protocol_methods_are_listed():
    with raises("pipeline: 'spec_pipelines:MissingMethodsPipeline' built a MissingMethodsPipeline "
                "that lacks bind_ar_diffusion_state, close_ar_diffusion_session, generate_block; "
                "implement SupportsARDiffusionPipeline and SupportsARDiffusionBlockGeneration"):
        build("spec_pipelines:MissingMethodsPipeline")


def test_spec_method_raising_keeps_the_cause():
    pipeline = build("spec_pipelines:SpecRaisesPipeline")
    with raises("pipeline: ar_diffusion_kv_cache_spec() raised RuntimeError: "
                "geometry unknown before load") as info:
        get_spec(pipeline)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_spec_method_returning_a_wrong_type():
    with raises("pipeline: ar_diffusion_kv_cache_spec() returned a dict; it must return an "
                "ARDiffusionKVCacheSpec"):
        get_spec(build("spec_pipelines:WrongSpecTypePipeline"))


def test_an_invalid_spec_is_reported_as_a_spec_error():
    with pytest.raises(SpecError, match=re.escape("spec.num_layers: 0 is invalid")) as info:
        get_spec(build("spec_pipelines:InvalidSpecPipeline"))
    assert not isinstance(info.value, PipelineLoadError)


def test_load_errors_exit_with_2():
    with pytest.raises(PipelineLoadError) as info:
        build("ardiff_no_such_module_xyz:Pipe")
    assert info.value.exit_code == 2


# ---- the load hook -------------------------------------------------------------------------

def test_build_pipeline_and_get_spec_do_not_call_load():
    pipeline = build("spec_pipelines:GoodPipeline")
    get_spec(pipeline)
    assert pipeline.load_calls == []


def test_inspect_spec_does_not_call_load(write_config, pipelines_file):
    config = load_config(write_config(f"""
        pipeline: {{entry: '{pipelines_file}:LoadRaisesPipeline'}}
        runtime: {{memory_budget: 1MiB}}
    """))
    assert inspect_spec(config).plan.session_capacity == 4


def test_sys_path_is_left_alone(pipelines_file):
    before = list(sys.path)
    build(f"{pipelines_file}:GoodPipeline")
    assert sys.path == before


# ---- messages do not grow with the input ---------------------------------------------------

def billion_laughs() -> list:
    """Nine levels of nine references: 9**10 strings expanded, 100 objects in memory."""
    value: list = ["lol"] * 9
    for _ in range(9):
        value = [value] * 9
    return value


def test_a_constructor_error_quotes_huge_args_in_a_few_hundred_characters():
    """Quoting args once took minutes and gigabytes: repr() expanded every shared list."""
    with pytest.raises(PipelineLoadError) as caught:
        build("spec_pipelines:MissingMethodsPipeline", lol=billion_laughs(), text="x" * 100_000)
    message = str(caught.value)
    assert message.startswith("pipeline: constructing 'spec_pipelines:MissingMethodsPipeline' "
                              "with args "
                              "{'lol': [[[...], [...], [...], [...], [...], [...], [...], [...], "
                              "...], ")
    assert "TypeError" in message and len(message) < 700


def test_a_long_entry_and_a_long_exception_are_cut(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "chatty_plugin", "raise RuntimeError('y' * 100_000)\n")
    with pytest.raises(PipelineLoadError) as caught:
        build("chatty_plugin:Pipe")
    assert len(str(caught.value)) < 400
    assert str(caught.value).startswith("pipeline.entry: importing 'chatty_plugin' raised "
                                        "RuntimeError: yyyy")
    with pytest.raises(PipelineLoadError) as caught:
        build("m" * 10_000 + ":Pipe")
    assert len(str(caught.value)) < 400


def test_an_entry_file_name_too_long_for_the_file_system(tmp_path):
    with raises("pipeline.entry: cannot read '"):
        build("a" * 5000 + ".py:Pipe", tmp_path)
    with raises("(OSError: File name too long); check the path"):
        build("a" * 5000 + ".py:Pipe", tmp_path)

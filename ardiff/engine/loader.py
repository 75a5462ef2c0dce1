"""Find, build and check the pipeline a config names (docs/design.md#2-the-contract, Loading).

    pipeline.entry: package.module:attr     imported from the Python path
    pipeline.entry: path/to/file.py:attr    loaded from a file, relative to the config file
    pipeline.entry: name                    registered in the `ardiff.pipelines` entry points

The attr is a class or factory called with the config's `args` as keyword arguments, as
written: a relative path among them is the pipeline's to open, from the working directory.
Construction must be cheap; the optional `load(device, dtype)` hook is *not* called here.
`declared_input_paths` reads the optional `ar_diffusion_input_paths()` (the files and folders
`load` will read), so that no output of a run can be one of them.
Messages quote the entry, the args and what a plugin raised in at most
`ardiff.text.MAX_SHOWN_CHARS` characters each.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType

from ardiff.config.run import PipelineConfig
from ardiff.contract import ARDiffusionPipeline, missing_pipeline_methods
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.errors import ArdiffError, PipelineLoadError, SpecError
from ardiff.text import short_repr, shorten

ENTRY_POINT_GROUP = "ardiff.pipelines"
INPUT_PATHS_HOOK = "ar_diffusion_input_paths"


def resolve_entry(entry: str, base_dir: Path) -> object:
    """The object (class or factory) an entry point names."""
    module_part, sep, attr = entry.rpartition(":")
    if not sep:
        return _from_entry_point_group(entry)
    if not module_part or not attr:
        raise PipelineLoadError(f"pipeline.entry: {short_repr(entry)} is malformed; write "
                                f"package.module:attr, path/file.py:attr or a registered name")
    if module_part.endswith(".py"):
        module = _import_file(module_part, base_dir)
    else:
        module = _import_module(module_part)
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        raise PipelineLoadError(f"pipeline.entry: {short_repr(module_part)} has no attribute "
                                f"{short_repr(attr)}; it defines: "
                                f"{shorten(', '.join(names[:12])) or 'nothing public'}") from None


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise PipelineLoadError(f"pipeline.entry: module {short_repr(name)} not found; "
                                    f"check the spelling or install the package that provides "
                                    f"it") from exc
        raise PipelineLoadError(f"pipeline.entry: importing {short_repr(name)} failed: "
                                f"{shorten(str(exc))}") from exc
    except Exception as exc:
        raise PipelineLoadError(f"pipeline.entry: importing {short_repr(name)} raised "
                                f"{type(exc).__name__}: {shorten(str(exc))}") from exc


def entry_file(entry: str, base_dir: Path) -> Path | None:
    """The file of a `path/to/file.py:attr` entry (relative to `base_dir`), else None."""
    module_part, sep, attr = entry.rpartition(":")
    if not (sep and attr and module_part.endswith(".py")):
        return None
    return (base_dir / module_part).resolve()


def _import_file(relative: str, base_dir: Path) -> ModuleType:
    path = (base_dir / relative).resolve()
    if not _is_file(path):
        raise PipelineLoadError(f"pipeline.entry: file {short_repr(str(path))} not found (paths "
                                f"are relative to the config file's folder "
                                f"{short_repr(str(base_dir))})")
    # A unique, stable module name per file, so two plugins called model.py do not clash.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"ardiff_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PipelineLoadError(f"pipeline.entry: running {short_repr(str(path))} raised "
                                f"{type(exc).__name__}: {shorten(str(exc))}") from exc
    return module


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError as exc:  # a name too long for the file system, a loop of links...
        raise PipelineLoadError(f"pipeline.entry: cannot read {short_repr(str(path))} "
                                f"({type(exc).__name__}: {exc.strerror}); check the "
                                f"path") from exc


def _from_entry_point_group(name: str) -> object:
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        known = sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
        raise PipelineLoadError(
            f"pipeline.entry: {short_repr(name)} is not a registered pipeline (known: "
            f"{', '.join(known) or 'none'}); use package.module:attr or path/file.py:attr")
    try:
        return found[0].load()
    except Exception as exc:
        raise PipelineLoadError(f"pipeline.entry: loading registered pipeline {short_repr(name)} "
                                f"raised {type(exc).__name__}: {shorten(str(exc))}") from exc


def build_pipeline(config: PipelineConfig, base_dir: Path) -> ARDiffusionPipeline:
    """Build the pipeline object and check it has every protocol method."""
    factory = resolve_entry(config.entry, base_dir)
    if not callable(factory):
        raise PipelineLoadError(f"pipeline.entry: {short_repr(config.entry)} is a "
                                f"{type(factory).__name__}, not a class or factory")
    try:
        pipeline: ARDiffusionPipeline = factory(**config.args)  # its methods: checked below
    except Exception as exc:
        # a typed error is the pipeline's own one line, its fix at the end: shown whole
        text = str(exc) if isinstance(exc, ArdiffError) else shorten(str(exc))
        raise PipelineLoadError(f"pipeline: constructing {short_repr(config.entry)} with args "
                                f"{short_repr(config.args)} raised {type(exc).__name__}: "
                                f"{text}{args_base_note(exc)}") from exc
    missing = missing_pipeline_methods(pipeline)
    if missing:
        raise PipelineLoadError(f"pipeline: {short_repr(config.entry)} built a "
                                f"{type(pipeline).__name__} that lacks {', '.join(missing)}; "
                                f"implement SupportsARDiffusionPipeline and "
                                f"SupportsARDiffusionBlockGeneration")
    return pipeline


def args_base_note(exc: BaseException) -> str:
    """Where a relative path the pipeline failed to open starts: `pipeline.args` reach the
    pipeline as written, so it opens them from the working directory (not the config's
    folder, the base of `pipeline.entry` and the rollout's files; docs/configs.md)."""
    name = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if not isinstance(name, str) or os.path.isabs(os.path.expanduser(name)):
        return ""
    return (f" (relative paths in pipeline.args are relative to the working directory "
            f"{short_repr(os.getcwd())})")


def get_spec(pipeline: ARDiffusionPipeline) -> ARDiffusionKVCacheSpec:
    """Call the pipeline's spec method and check what it returns."""
    try:
        spec = pipeline.ar_diffusion_kv_cache_spec()
    except SpecError:
        raise
    except Exception as exc:
        raise PipelineLoadError(f"pipeline: ar_diffusion_kv_cache_spec() raised "
                                f"{type(exc).__name__}: {shorten(str(exc))}") from exc
    if not isinstance(spec, ARDiffusionKVCacheSpec):
        raise PipelineLoadError(f"pipeline: ar_diffusion_kv_cache_spec() returned a "
                                f"{type(spec).__name__}; it must return an "
                                f"ARDiffusionKVCacheSpec")
    return spec


def declared_input_paths(pipeline: object) -> list[tuple[str, Path]]:
    """What the pipeline says `load` will read, as (name, path) pairs: its optional
    `ar_diffusion_input_paths()` returns a mapping of a name shown in messages (where the
    path came from, e.g. 'pipeline.args.model_dir') to a file or folder (None: skipped; `~`
    expanded; relative to the working directory). No hook: nothing. Raises
    PipelineLoadError when the hook raises or returns anything else."""
    hook = getattr(pipeline, INPUT_PATHS_HOOK, None)
    if hook is None:
        return []
    try:
        declared = hook()
    except ArdiffError:
        raise
    except Exception as exc:
        raise PipelineLoadError(f"pipeline: {INPUT_PATHS_HOOK}() raised {type(exc).__name__}: "
                                f"{shorten(str(exc))}") from exc
    if not isinstance(declared, Mapping):
        raise PipelineLoadError(f"pipeline: {INPUT_PATHS_HOOK}() returned a "
                                f"{type(declared).__name__}; it must return a mapping of names "
                                f"to paths, like {{'pipeline.args.model_dir': 'models/wan'}}")
    pairs = []
    for name, path in declared.items():
        if not isinstance(name, str):
            raise PipelineLoadError(f"pipeline: {INPUT_PATHS_HOOK}() has the key "
                                    f"{short_repr(name)} ({type(name).__name__}); its keys name "
                                    f"where each path comes from, like 'pipeline.args.ckpt'")
        if path is not None:
            pairs.append((name, _declared_path(name, path)))
    return pairs


def _declared_path(name: str, path: object) -> Path:
    where = f"pipeline: {INPUT_PATHS_HOOK}()[{short_repr(name)}] is {short_repr(path)}"
    if not isinstance(path, (str, os.PathLike)):
        raise PipelineLoadError(f"{where} ({type(path).__name__}); it must be a path (str or "
                                f"os.PathLike) or None")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise PipelineLoadError(f"{where}; give the path the pipeline reads, or None")
    if "\0" in text:
        raise PipelineLoadError(f"{where}, which holds a NUL byte; no file name can")
    return Path(text).expanduser()

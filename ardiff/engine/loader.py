"""Find, build and check the pipeline a config names (docs/design.md#2-the-contract, Loading).

    pipeline.entry: package.module:attr     imported from the Python path
    pipeline.entry: path/to/file.py:attr    loaded from a file, relative to the config file
    pipeline.entry: name                    registered in the `ardiff.pipelines` entry points

The attr is a class or factory called with the config's `args` as keyword arguments.
Construction must be cheap; the optional `load(device, dtype)` hook is *not* called here.
Messages quote the entry, the args and what a plugin raised in at most
`ardiff.text.MAX_SHOWN_CHARS` characters each.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

from ardiff.config.run import PipelineConfig
from ardiff.contract import ARDiffusionPipeline, missing_pipeline_methods
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.errors import PipelineLoadError, SpecError
from ardiff.text import short_repr, shorten

ENTRY_POINT_GROUP = "ardiff.pipelines"


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
        raise PipelineLoadError(f"pipeline: constructing {short_repr(config.entry)} with args "
                                f"{short_repr(config.args)} raised {type(exc).__name__}: "
                                f"{shorten(str(exc))}") from exc
    missing = missing_pipeline_methods(pipeline)
    if missing:
        raise PipelineLoadError(f"pipeline: {short_repr(config.entry)} built a "
                                f"{type(pipeline).__name__} that lacks {', '.join(missing)}; "
                                f"implement SupportsARDiffusionPipeline and "
                                f"SupportsARDiffusionBlockGeneration")
    return pipeline


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

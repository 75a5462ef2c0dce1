"""Build typed, frozen config objects from plain YAML data, with errors that name the path.

`build(cls, data, path)` walks the dataclass fields of `cls`:

- unknown keys raise `ConfigError` with the dotted path and a "did you mean";
- values are checked against the field's annotation (int, float, str, bool,
  `X | None`, `Literal[...]`, `list[X]`, `dict[str, Any]`, nested dataclasses,
  or any class with a `parse(value, where)` classmethod);
- defaults live only on the dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

from ardiff.errors import ConfigError


def build(cls: type, data: Any, path: str) -> Any:
    """Return `cls(**data)` after checking every key and value; raise `ConfigError`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise ConfigError(f"{_join(path, key)}: unknown key{_suggest(str(key), fields)}")
    values = {}
    for name, f in fields.items():
        where = _join(path, name)
        if name in data:
            values[name] = convert(hints[name], data[name], where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: required key is missing; add it to the config")
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def convert(annotation: Any, value: Any, where: str) -> Any:
    """Check and convert one value against a type annotation."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return _convert_union(typing.get_args(annotation), value, where)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            options = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{where}: {_show(value)} is not allowed; use one of {options}")
        return value
    if origin in (list, tuple):
        return _convert_list(annotation, value, where)
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_show(value)}")
        return dict(value)
    if annotation is Any:
        return value
    if hasattr(annotation, "parse"):
        return annotation.parse(value, where)
    if dataclasses.is_dataclass(annotation):
        return build(annotation, value, where)
    return _convert_scalar(annotation, value, where)


def _convert_union(args: tuple, value: Any, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    candidates = [a for a in args if a is not type(None)]
    if len(candidates) == 1:
        return convert(candidates[0], value, where)
    errors = []
    for candidate in candidates:
        try:
            return convert(candidate, value, where)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0])


def _convert_list(annotation: Any, value: Any, where: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected a list, got {_show(value)}")
    args = typing.get_args(annotation)
    item_type = args[0] if args else Any
    items = [convert(item_type, item, f"{where}[{i}]") for i, item in enumerate(value)]
    return tuple(items) if typing.get_origin(annotation) is tuple else items


def _convert_scalar(annotation: Any, value: Any, where: str) -> Any:
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {_show(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {_show(value)}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {_show(value)}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {_show(value)}")
    raise AssertionError(f"schema cannot convert to {annotation!r}")


def _show(value: Any) -> str:
    kind = {dict: "a mapping", list: "a list", type(None): "nothing (null)"}.get(type(value))
    return kind if kind else f"{value!r} ({type(value).__name__})"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _suggest(key: str, known: Any) -> str:
    names = [str(k) for k in known]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known keys: {', '.join(names)}" if names else ""

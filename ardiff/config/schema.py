"""Validate plain config data with pydantic; report the first problem as one `ConfigError` line.

    runtime.kv.windw_frames: unknown key; did you mean 'window_frames'?
    rollout.frames: expected an integer, got 'many' (str)
    runtime.kv.backend: 'flat' (str) is not allowed; use one of 'paged', 'dense'

The line names the dotted path, the value, the rule and the fix, for the problem a reader
meets first (a section's unknown keys before its values). Validators raise
`ValueError("<value> ...; <fix>")`; the path is put in front here. Values and keys are
quoted with `ardiff.text`, so no message grows with the input.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, TypeVar, Union

from pydantic import TypeAdapter, ValidationError

from ardiff.errors import ConfigError
from ardiff.text import key_name, short_repr

T = TypeVar("T")

# pydantic's words for a key a section lacks (a non-string key is "invalid").
_UNKNOWN_KEYS = {"unexpected_keyword_argument", "invalid_key"}
_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}
_RULES = {"value_error", "finite_number", *_BOUNDS}
_EXPECTED = {
    "int_type": "an integer", "bool_type": "true or false", "float_type": "a number",
    "string_type": "a string", "list_type": "a list", "dict_type": "a mapping",
    "dataclass_type": "a mapping of keys",
}


def validate(cls: type[T], data: Any) -> T:
    """Plain YAML data validated into a `cls`; raise `ConfigError` for the first problem."""
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise config_error(exc, cls) from exc


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of the plain data `validate(cls, data)` accepts."""
    return _adapter(cls).json_schema()


def config_error(exc: ValidationError, root: type) -> ConfigError:
    """The one-line `ConfigError` for the first problem pydantic found validating a `root`."""
    names = _field_names(root)
    issue = _first([_Issue.of(error, names) for error in exc.errors()])
    return ConfigError(f"{issue.where}: {issue.message(root)}")


@dataclass(frozen=True)
class _Issue:
    """One pydantic error, its `loc` cut down to the keys and list indices of the data."""

    kind: str
    path: tuple[str | int, ...]
    value: Any
    error: dict[str, Any]

    @classmethod
    def of(cls, error: Any, names: frozenset[str]) -> _Issue:
        # pydantic also puts the name of each member it tried of a union (`str`,
        # `list[PromptSwitch]`) into `loc`: keep list indices and field names, and the
        # key itself when it is unknown.
        loc, kind = error["loc"], error["type"]
        path = tuple(part for i, part in enumerate(loc) if isinstance(part, int) or part in names
                     or (kind in _UNKNOWN_KEYS and i == len(loc) - 1))
        return cls(kind, path, error.get("input"), error)

    @property
    def where(self) -> str:
        where = ""
        for i, part in enumerate(self.path):
            is_key = self.kind in _UNKNOWN_KEYS and i == len(self.path) - 1
            where += f"[{part}]" if isinstance(part, int) and not is_key else f".{key_name(part)}"
        return where.removeprefix(".")

    def message(self, root: type) -> str:
        ctx = self.error.get("ctx", {})
        if self.kind in _UNKNOWN_KEYS:
            return f"unknown key{_suggest(self.path[-1], _known_keys(root, self.path[:-1]))}"
        if self.kind == "missing":
            return "required key is missing; add it to the config"
        if self.kind in _EXPECTED:
            return f"expected {_EXPECTED[self.kind]}, got {_show(self.value)}"
        if self.kind == "literal_error":  # ctx: "'paged' or 'dense'"
            choices = ", ".join(ctx["expected"].rsplit(" or ", 1))
            return f"{_show(self.value)} is not allowed; use one of {choices}"
        if self.kind in _BOUNDS:
            rule, bound = _BOUNDS[self.kind]
            return f"{short_repr(self.value)} is invalid; it must be {rule} {ctx[bound]}"
        if self.kind == "finite_number":
            return f"{short_repr(self.value)} is invalid; it must be a finite number"
        if self.kind == "value_error":  # a rule of a section, or MemoryBudget's parser
            return str(ctx["error"])
        return f"{self.error['msg']}, got {_show(self.value)}"  # pydantic's words


def _first(issues: list[_Issue]) -> _Issue:
    """The issue a reader meets first. pydantic lists a section's unknown keys after its
    values; an unknown key of the section holding the first issue (or of one around it)
    comes before it. Of the issues a union's members found with one value, a rule broken in
    it (a schedule's frame out of bounds, a string that is not valid text), or else a problem
    inside it (a schedule entry's misspelt key: the value has the member's shape), says more
    than a type the value does not have."""
    first = issues[0]
    if first.kind in _EXPECTED:  # a union's member the value is not; did another one fit?
        inside = [issue for issue in issues if issue.path[:len(first.path)] == first.path]
        rules = [issue for issue in inside if issue.kind in _RULES]
        # ...inside an element that has the member's shape (a schedule entry is a mapping, a
        # block's actions a list): a list of plain values that is not a schedule is still
        # "not a string".
        depth = len(first.path) + (0 if first.path and isinstance(first.path[-1], int) else 1)
        deeper = [issue for issue in inside if len(issue.path) > depth]
        first = (rules or deeper or [first])[0]
    around = [issue for issue in issues if issue.kind in _UNKNOWN_KEYS
              and first.path[:len(issue.path) - 1] == issue.path[:-1]]
    return min(around, key=lambda issue: len(issue.path), default=first)


@cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


@cache
def _field_names(root: type) -> frozenset[str]:
    """Every key any section of `root` has (its JSON Schema lists them, unions included)."""
    schema = json_schema(root)
    sections = [schema, *schema.get("$defs", {}).values()]
    return frozenset(name for section in sections for name in section.get("properties", {}))


def _known_keys(root: type, path: tuple[str | int, ...]) -> list[str]:
    """The keys of the section at `path` (none if the path leads elsewhere); list indices and
    unions on the way (a schedule entry of `rollout.prompt`) are looked through."""
    sections = [root]
    for key in path:
        found: list[Any] = []
        for section in sections:
            if isinstance(key, int):
                if typing.get_origin(section) in (list, tuple):
                    found += _members(typing.get_args(section)[0])
                continue
            field = getattr(section, "__pydantic_fields__", {}).get(key)
            if field is not None:
                found += _members(field.annotation)
        sections = found
    return [name for section in sections
            for name, field in getattr(section, "__pydantic_fields__", {}).items()
            if field.init is not False]


def _members(annotation: Any) -> list[Any]:
    """The types an annotation may hold: the members of a union, through `Annotated`."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [member for arg in typing.get_args(annotation) for member in _members(arg)]
    return [annotation]


def _show(value: Any) -> str:
    kind = {dict: "a mapping", list: "a list", type(None): "nothing (null)"}.get(type(value))
    return kind if kind else f"{short_repr(value)} ({type(value).__name__})"


def _suggest(key: object, known: list[str]) -> str:
    if not isinstance(key, str) or len(key) > 100:  # nothing is close to a long key
        close = []
    else:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known keys: {', '.join(known)}" if known else ""

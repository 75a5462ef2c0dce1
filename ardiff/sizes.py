"""Byte sizes as people write them (`6GiB`, `512MiB`, `1.5GB`, `0.8` of free memory), and the
integer arithmetic sizes are made of (`ceil_div`).

A budget is a whole number of bytes from 1 to `MAX_BUDGET_BYTES` (1 PiB: no device has that
much, so more is a typo) or a finite fraction in (0, 1]; `build_runner` then refuses a byte
budget above what the device has free."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ardiff.errors import ConfigError
from ardiff.text import short_repr

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
MAX_BUDGET_BYTES = 2**50  # 1 PiB
_SIZE_HINT = "write bytes like 6GiB, 512MiB, 1.5GB or 1000000, or a fraction of free memory like 0.8"


def ceil_div(a: int, b: int) -> int:
    """The smallest integer >= a / b (for b > 0), in exact integer arithmetic."""
    return -(-a // b)


@dataclass(frozen=True)
class MemoryBudget:
    """A budget in bytes, or a fraction (0, 1] of the device memory free after `load`."""

    num_bytes: int | None = None
    fraction: float | None = None

    def resolve(self, free_bytes: int) -> int:
        """The budget in bytes, given what the device has free."""
        if self.num_bytes is not None:
            return self.num_bytes
        assert self.fraction is not None
        return int(free_bytes * self.fraction)

    def __str__(self) -> str:
        if self.num_bytes is not None:
            return format_bytes(self.num_bytes)
        return f"{self.fraction:g} of free memory"

    @classmethod
    def parse(cls, value: object, where: str) -> MemoryBudget:
        """Parse a YAML/CLI value; raise `ConfigError` naming `where` and the value."""
        try:
            return cls._from_value(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def _from_value(cls, value: object) -> MemoryBudget:
        """Parse a value; raise `ValueError` saying what is wrong with it (without a place)."""
        if isinstance(value, MemoryBudget):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{short_repr(value)} is not a size; {_SIZE_HINT}")
        if isinstance(value, int):
            return cls(num_bytes=_positive_bytes(value, value))
        if isinstance(value, float):
            return cls._from_number(value, value)
        match = _SIZE_RE.match(value)
        if not match:
            raise ValueError(f"{short_repr(value)} is not a size; {_SIZE_HINT}")
        number, unit = match.group(1), match.group(2).lower()
        if unit == "" and "." in number:
            return cls._from_number(float(number), value)
        if unit not in _UNITS and unit != "":
            raise ValueError(f"{short_repr(value)} has unknown unit {short_repr(match.group(2))}; "
                             f"use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
        # Decimal, not float: 2.01KB is 2010 bytes, not 2009. Decimal also takes any number
        # of digits, where int() stops at 4300.
        return cls(num_bytes=_positive_bytes(Decimal(number) * _UNITS[unit or "b"], value))

    @classmethod
    def _from_number(cls, number: int | float, raw: object) -> MemoryBudget:
        if isinstance(number, int):
            return cls(num_bytes=_positive_bytes(number, raw))
        if 0.0 < number <= 1.0:  # False for nan
            return cls(fraction=number)
        raise ValueError(f"{short_repr(raw)} is neither a fraction in (0, 1] nor a whole "
                         f"number of bytes; {_SIZE_HINT}")

    # How pydantic (the run config) validates a budget and describes it in the JSON Schema.
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        # Written back (a default in the JSON Schema) as a config value: bytes or a fraction.
        as_value = core_schema.plain_serializer_function_ser_schema(
            lambda budget: budget.fraction if budget.num_bytes is None else budget.num_bytes)
        return core_schema.no_info_plain_validator_function(cls._from_value,
                                                            serialization=as_value)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        units = "|".join("".join(f"[{c}{c.upper()}]" for c in unit) for unit in _UNITS)
        return {"description": f"A KV memory budget: {_SIZE_HINT}.", "anyOf": [
            {"type": "string", "pattern": rf"^\s*[0-9]*\.?[0-9]+\s*({units})?\s*$"},
            {"type": "integer", "minimum": 1, "maximum": MAX_BUDGET_BYTES},
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1}]}


def _positive_bytes(num_bytes: int | Decimal, raw: object) -> int:
    """Whole bytes from 1 to MAX_BUDGET_BYTES (a fraction of a byte is dropped)."""
    if num_bytes > MAX_BUDGET_BYTES:
        raise ValueError(f"{short_repr(raw)} is more than {format_bytes(MAX_BUDGET_BYTES)}, the "
                         f"largest budget ardiff plans; give what the device has, like 80GiB, "
                         f"or a fraction of free memory like 0.8")
    if int(num_bytes) <= 0:
        raise ValueError(f"{short_repr(raw)} must be more than 0 bytes; {_SIZE_HINT}")
    return int(num_bytes)


def format_bytes(num_bytes: int | float, round_down: bool = False) -> str:
    """`3355443` -> `3.2MiB` (binary units, one decimal below 10). `round_down`: never more
    than `num_bytes` (`3.99GiB` -> `3.9GiB`), for a limit a user may copy."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)}B"
            decimals = 1 if abs(value) < 10 else 0
            if round_down:
                value = math.floor(value * 10**decimals) / 10**decimals
            return f"{value:.{decimals}f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")

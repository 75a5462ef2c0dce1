"""ardiff/sizes.py: byte sizes and fractions as people write them, and how they print."""

from __future__ import annotations

import re

import pytest

from ardiff.errors import ConfigError
from ardiff.sizes import MAX_BUDGET_BYTES, MemoryBudget, format_bytes

WHERE = "runtime.memory_budget"
HINT = ("write bytes like 6GiB, 512MiB, 1.5GB or 1000000, "
        "or a fraction of free memory like 0.8")


def parse(value):
    return MemoryBudget.parse(value, WHERE)


@pytest.mark.parametrize("text, num_bytes", [
    ("6GiB", 6 * 2**30),
    ("512MiB", 512 * 2**20),
    ("1.5GB", 1_500_000_000),
    ("2.01KB", 2010),             # exact decimal arithmetic, no float truncation (2009)
    ("0.5KiB", 512),
    ("64kib", 64 * 1024),         # units are case-insensitive
    (" 6 GiB ", 6 * 2**30),       # spaces around and between are fine
    ("1TB", 10**12),
    ("2TiB", 2 * 2**40),
    ("100B", 100),
    ("1000000", 1_000_000),       # a string without a unit: bytes
    (1_000_000, 1_000_000),       # a YAML int: bytes
    (1, 1),                       # 1 is one byte, not "all of it": fractions are floats
])
def test_byte_sizes(text, num_bytes):
    assert parse(text) == MemoryBudget(num_bytes=num_bytes)


@pytest.mark.parametrize("value, fraction", [(0.8, 0.8), ("0.8", 0.8), (1.0, 1.0), (".25", 0.25)])
def test_fractions_of_free_memory(value, fraction):
    assert parse(value) == MemoryBudget(fraction=fraction)


@pytest.mark.parametrize("value", ["lots", "", "6GiB6", "-1GiB", "6 Gi B", True, None, [1], {}])
def test_malformed_sizes(value):
    with pytest.raises(ConfigError, match=re.escape(f"{WHERE}: {value!r} is not a size; {HINT}")):
        parse(value)


def test_unknown_unit():
    with pytest.raises(ConfigError, match=re.escape(
            f"{WHERE}: '6GiBs' has unknown unit 'GiBs'; "
            f"use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")):
        parse("6GiBs")


@pytest.mark.parametrize("value", [0, -1, "0", "0GiB", "0.1B"])
def test_zero_and_negative_byte_counts(value):
    with pytest.raises(ConfigError, match=re.escape(
            f"{WHERE}: {value!r} must be more than 0 bytes; {HINT}")):
        parse(value)


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, "2.5"])
def test_numbers_that_are_neither_fractions_nor_whole_bytes(value):
    with pytest.raises(ConfigError, match=re.escape(
            f"{WHERE}: {value!r} is neither a fraction in (0, 1] nor a whole number of bytes; "
            f"{HINT}")):
        parse(value)


def test_parse_passes_a_budget_through():
    budget = MemoryBudget(num_bytes=5)
    assert parse(budget) is budget


def test_resolve():
    assert MemoryBudget(num_bytes=6 * 2**30).resolve(free_bytes=10) == 6 * 2**30
    assert MemoryBudget(fraction=0.8).resolve(free_bytes=1000) == 800
    assert MemoryBudget(fraction=0.5).resolve(free_bytes=1001) == 500  # rounds down


def test_str():
    assert str(MemoryBudget(num_bytes=6 * 2**30)) == "6.0GiB"
    assert str(MemoryBudget(fraction=0.8)) == "0.8 of free memory"


@pytest.mark.parametrize("num_bytes, text", [
    (0, "0B"),
    (1023, "1023B"),
    (1024, "1.0KiB"),
    (3_355_443, "3.2MiB"),
    (10 * 2**20, "10MiB"),
    (287_539_200, "274MiB"),
    (5 * 2**40, "5.0TiB"),
    (2**50, "1024TiB"),     # TiB is the largest unit
])
def test_format_bytes(num_bytes, text):
    assert format_bytes(num_bytes) == text


def test_the_json_schema_accepts_what_parse_accepts():
    """Editors check `memory_budget` with the JSON Schema: it agrees with `parse` on form."""
    jsonschema = pytest.importorskip("jsonschema")
    from pydantic import TypeAdapter

    schema = TypeAdapter(MemoryBudget).json_schema()
    for good in ["6GiB", " 6 GiB ", "64kib", "1.5GB", "100B", "1000000", ".25", 4096, 0.8, 1.0]:
        parse(good)
        jsonschema.validate(good, schema)
    for bad in ["lots", "6GiB6", "6 Gi B", "-1GiB", "6GiBs", "12XB", True, None, 0, -5, 1.5]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


# ---- bounds --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [MAX_BUDGET_BYTES, "1024TiB", "1125899906842624"])
def test_the_largest_budget_is_one_pib(value):
    assert parse(value) == MemoryBudget(num_bytes=MAX_BUDGET_BYTES)


@pytest.mark.parametrize("value", [MAX_BUDGET_BYTES + 1, "1025TiB", "1200TB", 10**5000,
                                   "9" * 5000, "9" * 5000 + "GiB"],
                         ids=["1PiB+1", "1025TiB", "1200TB", "int-5001-digits", "str-5000-digits",
                              "str-5000-digits-GiB"])
def test_a_budget_beyond_any_device_is_refused(value):
    """Even past the 4300 digits int() takes, and in a message of bounded length."""
    with pytest.raises(ConfigError, match=re.escape(
            " is more than 1024TiB, the largest budget ardiff plans; give what the device "
            "has, like 80GiB, or a fraction of free memory like 0.8")) as caught:
        parse(value)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "nan", "inf"])
def test_a_fraction_is_finite(value):
    with pytest.raises(ConfigError, match="is (neither a fraction in|not a size)"):
        parse(value)


@pytest.mark.parametrize("num_bytes, text", [
    (int(9.99 * 2**30), "9.9GiB"),
    (int(22.9 * 2**30), "22GiB"),
    (1023, "1023B"),
    (2**20, "1.0MiB"),
])
def test_format_bytes_rounding_down(num_bytes, text):
    """A limit a user may copy never reads more than there is."""
    assert format_bytes(num_bytes, round_down=True) == text
    assert parse(text).num_bytes <= num_bytes

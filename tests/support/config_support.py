"""Helpers of the config tests: a minimal config, built with overrides, and `raises`."""

from __future__ import annotations

import re

import pytest

from ardiff.config.run import build_config
from ardiff.errors import ConfigError

MINIMAL = {"pipeline": {"entry": "pkg.mod:Pipe"}}


def build(data=None, overrides=()):
    """The config of `data` (default: MINIMAL) with `--set` overrides applied."""
    return build_config(MINIMAL if data is None else data, list(overrides))


def with_section(section: str, values) -> dict:
    return {**MINIMAL, section: values}


def raises(message: str):
    """pytest.raises(ConfigError) whose message must contain `message` literally."""
    return pytest.raises(ConfigError, match=re.escape(message))

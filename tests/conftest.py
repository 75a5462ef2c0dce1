"""Shared fixtures. Test helpers live in tests/support/, which pytest puts on the import path
(`pythonpath` in pyproject.toml), so `spec_pipelines:Name` entries import."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

PIPELINES_FILE = Path(__file__).parent / "support" / "spec_pipelines.py"


@pytest.fixture
def pipelines_file() -> Path:
    """Absolute path of the fixture pipelines, for `file.py:attr` entries."""
    return PIPELINES_FILE


@pytest.fixture
def write_config(tmp_path):
    """`write_config(text, name="run.yaml") -> Path`: dedented YAML written under tmp_path."""

    def write(text: str, name: str = "run.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tests use tiny tensors: one intra-op thread is faster than two, and immune to the
    spin-waits of a busy 2-core machine (measured: an attention call 16 us vs 6-10 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

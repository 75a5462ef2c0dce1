"""Fixtures the pipeline tests share: torch's thread count, set and put back."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """One torch thread for the test (as the shipped pipelines run on CPU), then as before."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def restore_threads():
    """The thread count put back after the test (a pipeline's `load` sets its own)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)

"""tests/kv helpers: `kvdrive` (tiny specs, the DESIGN §3 window model, the paged-vs-dense lockstep)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# Importable as `import kvdrive` whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors: one intra-op thread is faster, and immune to a busy machine's spin-waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

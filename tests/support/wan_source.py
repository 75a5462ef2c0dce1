"""Wan's own modules (Wan-Video/Wan2.1 `wan/modules/*.py`), imported from the checkout that
ARDIFF_WAN_SRC names, for the proofs that compare against Wan's code; never copied into
ardiff. Without the variable the test is skipped:

    git -C <mirror of Wan-Video/Wan2.1> archive HEAD wan/modules | tar -x -C /tmp/wan21
    ARDIFF_WAN_SRC=/tmp/wan21 pytest tests/pipelines/causal_wan/test_t5_keymap.py

Each module is loaded on its own inside a stand-in package, so wan/__init__.py (which imports
every model, flash-attention and friends) never runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

ENV = "ARDIFF_WAN_SRC"
PACKAGE = "_wan_modules"


def wan_module(name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """`wan/modules/<name>.py` of ARDIFF_WAN_SRC, or a skip."""
    source = os.environ.get(ENV)
    if not source:
        pytest.skip(f"set {ENV} to a checkout of Wan-Video/Wan2.1 to compare with Wan's code")
    folder = Path(source) / "wan" / "modules"
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    monkeypatch.setitem(sys.modules, PACKAGE, package)
    # t5.py imports its tokenizer wrapper (ftfy, regex) at the top; the encoder does not use it
    tokenizers = types.ModuleType(f"{PACKAGE}.tokenizers")
    tokenizers.HuggingfaceTokenizer = None
    monkeypatch.setitem(sys.modules, f"{PACKAGE}.tokenizers", tokenizers)
    # vae.py imports einops for its forward only; building the module does not need it
    try:
        importlib.import_module("einops")
    except ImportError:
        einops = types.ModuleType("einops")
        einops.rearrange = None
        monkeypatch.setitem(sys.modules, "einops", einops)
    # t5.py's T5EncoderModel has `device=torch.cuda.current_device()` as a default argument
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    full = f"{PACKAGE}.{name}"
    spec = importlib.util.spec_from_file_location(full, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, full, module)
    spec.loader.exec_module(module)
    return module

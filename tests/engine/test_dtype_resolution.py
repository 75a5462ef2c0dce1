"""runtime.dtype `auto`: bfloat16 on CUDA, float32 on CPU, resolved with the device
(ardiff/engine/device.py); a dry run plans with the dtype of the device it assumes."""

from __future__ import annotations

import pytest

from ardiff.engine import device


@pytest.mark.parametrize("name, expected", [
    ("cpu", "float32"), ("cuda", "bfloat16"), ("cuda:0", "bfloat16"), ("cuda:3", "bfloat16")])
def test_auto_follows_the_device(name, expected):
    assert device.resolve_dtype("auto", name) == expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", ["cpu", "cuda:1"])
def test_an_explicit_dtype_is_kept(dtype, name):
    assert device.resolve_dtype(dtype, name) == dtype


def test_auto_needs_a_resolved_device():
    with pytest.raises(ValueError, match="needs a resolved device"):
        device.resolve_dtype("auto", "auto")


@pytest.mark.parametrize("has_cuda, expected", [(True, "cuda"), (False, "cpu")])
def test_a_dry_run_assumes_what_auto_would_pick(monkeypatch, has_cuda, expected):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: has_cuda)
    assert device.assumed_device("auto") == expected
    assert device.assumed_device("cuda:1") == "cuda:1"  # named: taken as given, not checked


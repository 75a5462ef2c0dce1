"""Attention kernels (ardiff/kv/kernels.py): feature detection, the choice a cache makes,
and (on CUDA, behind the marker) every installed flash kernel against SDPA."""

from __future__ import annotations

import pytest
import torch
from kvdrive import Lockstep, drive_random, make_spec, plan_for

from ardiff.kv import kernels
from ardiff.kv.backend import create_cache
from ardiff.kv.kernels import Kernel
from ardiff.pipelines.shared.sampling import block_noise

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def kernel_list(monkeypatch):
    """KERNELS as shipped, restored after the test."""
    monkeypatch.setattr(kernels, "KERNELS", list(kernels.KERNELS))
    monkeypatch.setattr(kernels, "_loaded", dict(kernels._loaded))
    return kernels.KERNELS


def test_on_cpu_only_sdpa_runs():
    for dtype in (torch.float32, torch.bfloat16):
        assert kernels.available(torch.device("cpu"), dtype, 64) == ["sdpa"]
    cache = create_cache(plan_for(make_spec()), "paged")
    assert cache.kernel_name == "sdpa"


def test_a_kernel_whose_package_is_missing_is_not_chosen(kernel_list):
    kernels.register(Kernel("ghost", "ardiff_no_such_package", lambda d, t, hs: True,
                            lambda: pytest.fail("a missing package was imported")))
    assert kernels.available(torch.device("cpu"), torch.float32, 8) == ["sdpa"]


def test_a_registered_kernel_serves_paged_and_dense_alike(kernel_list):
    calls = []

    def counting(q, k, v, scale=None):
        calls.append(k.shape[0])
        return kernels.by_name("sdpa")(q, k, v, scale)

    kernels.register(Kernel("counting", None, lambda d, t, hs: d.type == "cpu",
                            lambda: counting))
    spec = make_spec(num_layers=2, tokens_per_frame=3, frames_per_block=2, window_frames=4,
                     sink_frames=1, registers=2)
    lock = Lockstep(spec, page_tokens=2, seed=3)
    assert lock.paged.kernel_name == lock.dense.kernel_name == "counting"
    drive_random(lock, ["s"], min_frames=10, seed=1)
    assert len(calls) == 2 * lock.num_attends, "every attend of both caches used the kernel"


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_installed_cuda_kernel_matches_sdpa(dtype):
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(96, 8, 128, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(300, 2, 128, device=device, dtype=dtype, generator=gen)
            for _ in range(2))
    want = kernels.by_name("sdpa")(q, k, v, 0.1).float()
    for name in kernels.available(device, dtype, 128):
        got = kernels.by_name(name)(q, k, v, 0.1)
        assert got.shape == q.shape and got.dtype == dtype, name
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.cuda
@CUDA
def test_block_noise_on_cuda_is_the_cpu_noise():
    cpu = block_noise((2, 4, 8, 8), 5, 3, torch.device("cpu"), torch.float32)
    gpu = block_noise((2, 4, 8, 8), 5, 3, torch.device("cuda"), torch.float32)
    assert torch.equal(gpu.cpu(), cpu)

"""Attention kernels over gathered K/V, one chosen per cache from what is installed.

    name         when it is used                                    package
    flashinfer   CUDA, fp16/bf16, head_size in 64/128/256           flashinfer
    flash_attn   CUDA, fp16/bf16, head_size <= 256, a multiple of 8  flash-attn
    sdpa         everywhere else (and the reference)                 torch

Every kernel has one signature, `attend(q, k, v, scale) -> out`, with q [q_tokens, q_heads,
hs], k and v [kv_tokens, kv_heads, hs] (q_heads a multiple of kv_heads) and out like q:
the layout both flash libraries take as it is (no transposes). A package is looked for
when a cache is built, never imported before. Paged and dense caches of one runtime use
the same kernel, so their equality does not depend on it.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from ardiff.kv import attention

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor]
# The same over B rows of equal key count: q [B, q_tokens, q_heads, hs], k/v [B, kv_tokens,
# kv_heads, hs] (the batched attend's stacked groups, ardiff.kv.backend.attend_rows).
StackedAttendFn = AttendFn
HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Kernel:
    """A kernel: the package it needs, where it fits, and how to get its `attend`."""

    name: str
    package: str | None
    fits: Callable[[torch.device, torch.dtype, int], bool]
    load: Callable[[], AttendFn]

    def is_available(self, device: torch.device, dtype: torch.dtype, head_size: int) -> bool:
        if not self.fits(device, dtype, head_size):
            return False
        return self.package is None or importlib.util.find_spec(self.package) is not None


def _flash_attn() -> AttendFn:
    flash_attn_func = importlib.import_module("flash_attn").flash_attn_func

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        out: torch.Tensor = flash_attn_func(q[None], k[None], v[None], softmax_scale=scale)[0]
        return out

    return attend


def _flash_attn_stacked() -> StackedAttendFn:
    flash_attn_func = importlib.import_module("flash_attn").flash_attn_func

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        out: torch.Tensor = flash_attn_func(q, k, v, softmax_scale=scale)
        return out

    return attend


def _flashinfer() -> AttendFn:
    prefill = importlib.import_module("flashinfer").single_prefill_with_kv_cache

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
        out: torch.Tensor = prefill(q, k, v, causal=False, sm_scale=scale)
        return out

    return attend


def _cuda_half(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in HALF


KERNELS: list[Kernel] = [  # in order of preference
    Kernel("flashinfer", "flashinfer",
           lambda d, t, hs: _cuda_half(d, t) and hs in (64, 128, 256), _flashinfer),
    Kernel("flash_attn", "flash_attn",
           lambda d, t, hs: _cuda_half(d, t) and hs <= 256 and hs % 8 == 0, _flash_attn),
    Kernel("sdpa", None, lambda d, t, hs: True, lambda: attention.attend),
]


def register(kernel: Kernel) -> None:
    """Add a kernel, preferred over those already known."""
    KERNELS.insert(0, kernel)


def available(device: torch.device, dtype: torch.dtype, head_size: int) -> list[str]:
    """Names of the kernels that would run here, preferred first (`sdpa` always last)."""
    return [k.name for k in KERNELS if k.is_available(device, dtype, head_size)]


def by_name(name: str) -> AttendFn:
    """The `attend` of a kernel `select` chose (the custom op gets kernels by name)."""
    if name not in _loaded:
        _loaded[name] = next(k for k in KERNELS if k.name == name).load()
    return _loaded[name]


_loaded: dict[str, AttendFn] = {"sdpa": attention.attend}


# Kernels that take B rows at once, by name. flashinfer's single prefill takes one
# sequence (its batch prefill over paged K/V needs a plan per batch: not wired in), so a
# cache on it attends row by row.
STACKED: dict[str, Callable[[], StackedAttendFn]] = {
    "sdpa": lambda: attention.attend_stacked,
    "flash_attn": _flash_attn_stacked,
}


def stacked(name: str) -> StackedAttendFn | None:
    """The B-row form of kernel `name`, or None if it has none (rows then go one by one)."""
    load = STACKED.get(name)
    return None if load is None else load()


def select(device: torch.device, dtype: torch.dtype, head_size: int) -> tuple[str, AttendFn]:
    """The preferred kernel that runs here: (name, attend)."""
    kernel = next(k for k in KERNELS if k.is_available(device, dtype, head_size))
    return kernel.name, by_name(kernel.name)

"""Devices and their free memory. Imports torch only when a CUDA device is involved."""

from __future__ import annotations

import os

from ardiff.errors import ConfigError


def resolve_device(name: str) -> str:
    """`auto` -> `cuda` when available else `cpu`; check that a CUDA device exists."""
    if name == "cpu":
        return name
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(f"runtime.device: {name!r} was requested but CUDA is not available "
                          f"on this machine; use --device cpu")
    index = int(name.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"runtime.device: {name!r} does not exist; this machine has "
                          f"{torch.cuda.device_count()} CUDA device(s) (cuda:0..)")
    return name


def free_memory_bytes(device: str) -> int:
    """Memory free for the KV cache on `device` now (CPU: the system's available memory)."""
    if device == "cpu":
        return _available_system_memory()
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def _available_system_memory() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

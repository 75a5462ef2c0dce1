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


def assumed_device(name: str) -> str:
    """The device a dry run (`inspect-spec`) plans for: `auto` is what `resolve_device`
    would pick here; a named device is taken as given (it need not exist on this machine)."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str) -> str:
    """`runtime.dtype` for a resolved `device` (cpu, cuda, cuda:N): `auto` is bfloat16 on
    CUDA (half the KV bytes, the flash kernels' dtype) and float32 on CPU (bfloat16
    matmuls are slow on most CPUs); an explicit dtype is kept."""
    if dtype != "auto":
        return dtype
    if device == "auto":
        raise ValueError("resolve_dtype needs a resolved device (cpu, cuda, cuda:N), not auto")
    return "bfloat16" if device.startswith("cuda") else "float32"


def free_memory_bytes(device: str) -> int:
    """Memory free for the KV cache on `device` now (CPU: the system's available memory)."""
    if device == "cpu":
        return _available_system_memory()
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def _available_system_memory() -> int:
    """The system's available memory, or what this process's cgroup still allows if less
    (in a container MemAvailable is the host's, and the cgroup limit kills first)."""
    available = _meminfo_available()
    room = _cgroup_room()
    return available if room is None else min(available, room)


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# (limit, usage) files of cgroup v2 and v1; the inactive file cache is reclaimable.
_CGROUP_FILES = (("memory.max", "memory.current", "inactive_file"),
                 ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
_CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/memory")


def _cgroup_room() -> int | None:
    """Bytes the memory cgroup of this process can still take, or None without a limit."""
    rooms = []
    for folder in _cgroup_folders():
        for limit_name, usage_name, inactive_name in _CGROUP_FILES:
            limit = _read_int(os.path.join(folder, limit_name))
            usage = _read_int(os.path.join(folder, usage_name))
            if limit is None or usage is None or limit >= 2**60:  # 'max' or v1's "no limit"
                continue
            inactive = _memory_stat(os.path.join(folder, "memory.stat"), inactive_name)
            rooms.append(max(0, limit - usage + inactive))
    return min(rooms) if rooms else None


def _cgroup_folders() -> list[str]:
    """The cgroup folders of this process (from /proc/self/cgroup), and the roots."""
    relative = []
    try:
        with open("/proc/self/cgroup") as cgroups:
            for line in cgroups:
                _id, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers in ("", "memory") or "memory" in controllers.split(","):
                    relative.append(path.lstrip("/"))
    except (OSError, ValueError):
        pass
    folders = [os.path.join(root, path) for root in _CGROUP_ROOTS for path in relative if path]
    return [folder for folder in [*folders, *_CGROUP_ROOTS] if os.path.isdir(folder)]


def _read_int(path: str) -> int | None:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _memory_stat(path: str, key: str) -> int:
    try:
        with open(path) as file:
            for line in file:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0

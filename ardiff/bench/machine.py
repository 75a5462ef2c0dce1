"""What machine a bench ran on: its CPU model, what torch's CPU kernels use, cores, load.

    machine_record(threads, load_before, load_after)   # the `machine` object of bench JSON

Numbers mean little without the machine beside them: every bench header and `--json`
names the CPU model and torch's CPU capability (the widest vector ISA its kernels use,
`torch.backends.cpu.get_cpu_capability()`: e.g. AVX2, AVX512, DEFAULT).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine (what else runs beside the bench)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` says, else unknown."""
    try:
        for line in CPUINFO.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_capability() -> str:
    """torch's CPU capability: the vector instruction set its CPU kernels were chosen for."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def machine_record(threads: int, load_before: list[float], load_after: list[float]
                   ) -> dict[str, Any]:
    return {"cpu_model": cpu_model(), "cpu_capability": cpu_capability(),
            "cpus": os.cpu_count(), "torch_threads": threads,
            "load_before": load_before, "load_after": load_after}

"""What `run_bench` measured, as one object and as JSON (`BenchReport.to_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ardiff.bench.arms import Arm
from ardiff.bench.machine import load_average, machine_record
from ardiff.bench.spread import Spread, paired_ratios
from ardiff.kv.backends import DEFAULT_BACKEND, backend_names, reference_backend

# The paired ratios a bench reports: (name, numerator arm, denominator arm): each KV backend
# against the reference backend (paged/dense), then the default backend against a
# hand-written loop and against itself compiled.
RATIOS = (*((f"{name}/{reference_backend()}", name, reference_backend())
            for name in backend_names() if name != reference_backend()),
          ("ardiff/reference", DEFAULT_BACKEND, "reference"),
          ("eager/compiled", DEFAULT_BACKEND, "compiled"))


@dataclass
class BenchReport:
    """Per-arm block times, the paired ratios between arms, and what else a bench measured.

    `arms` holds every arm that ran; `unavailable` says, per arm that did not, why.
    """

    blocks: int
    repeats: int
    threads: int
    plan_min_bytes: int
    arms: dict[str, Arm]
    unavailable: dict[str, str] = field(default_factory=dict)
    max_abs_frame_diff: dict[str, int] = field(default_factory=dict)
    kv_bytes_allocated: dict[str, int] = field(default_factory=dict)
    warmup_s: dict[str, float] = field(default_factory=dict)
    encode: dict[str, Any] | None = None
    sweep: list[dict[str, int]] = field(default_factory=list)
    peak_rss_bytes: int = 0
    load_before: list[float] = field(default_factory=load_average)
    load_after: list[float] = field(default_factory=list)

    def ratio(self, numerator: str, denominator: str, kind: str = "wall_s") -> Spread | None:
        """Paired per-block ratio numerator / denominator; None when an arm did not run."""
        if numerator not in self.arms or denominator not in self.arms:
            return None
        times = [getattr(self.arms[name].times, kind) for name in (numerator, denominator)]
        return Spread.of(paired_ratios(*times))

    @property
    def rss_growth(self) -> float | None:
        if len(self.sweep) < 2:
            return None
        return self.sweep[-1]["rss_bytes"] / self.sweep[0]["rss_bytes"] - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks, "repeats": self.repeats,
            "machine": machine_record(self.threads, self.load_before, self.load_after),
            "arms": {name: _arm_dict(arm, self.kv_bytes_allocated.get(name), self.plan_min_bytes)
                     for name, arm in self.arms.items()},
            "unavailable": dict(self.unavailable),
            "ratios": {name: self._ratio_dict(a, b) for name, a, b in RATIOS},
            "max_abs_frame_diff": dict(self.max_abs_frame_diff),
            "warmup_s": dict(self.warmup_s),
            "compile_s": self._compile_s(),
            "plan_min_bytes": self.plan_min_bytes,
            "encode": self.encode,
            "sweep": self.sweep, "rss_growth": self.rss_growth,
            "peak_rss_bytes": self.peak_rss_bytes,
        }

    def _ratio_dict(self, numerator: str, denominator: str) -> dict[str, Any] | None:
        wall, cpu = (self.ratio(numerator, denominator, kind) for kind in ("wall_s", "cpu_s"))
        if wall is None:
            return None
        return {"wall": wall.to_dict(), "cpu": cpu.to_dict()}

    def _compile_s(self) -> float | None:
        """Compiled warmup beyond eager warmup: what compiling cost, once."""
        if "compiled" not in self.warmup_s:
            return None
        return self.warmup_s["compiled"] - self.warmup_s[DEFAULT_BACKEND]


def _arm_dict(arm: Arm, kv_bytes: int | None, plan_min_bytes: int) -> dict[str, Any]:
    return {"wall_s": Spread.of(arm.times.wall_s).to_dict(),
            "cpu_s": Spread.of(arm.times.cpu_s).to_dict(),
            "blocks": {"wall_s": list(arm.times.wall_s),  # one entry per timed block, in order
                       "cpu_s": list(arm.times.cpu_s)},
            "kv_bytes_allocated": kv_bytes,
            "kv_bytes_vs_plan_min": None if kv_bytes is None else kv_bytes / plan_min_bytes}

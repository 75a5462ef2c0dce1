"""A measurement's median and spread, and paired per-block ratios of two arms."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ardiff.rollout.report import percentile


@dataclass(frozen=True)
class Spread:
    """Median, 10th and 90th percentile of `n` samples."""

    median: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        """None for no values."""
        if not values:
            return None
        return cls(statistics.median(values), percentile(values, 10), percentile(values, 90),
                   len(values))

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "p10": self.p10, "p90": self.p90, "n": self.n}


def paired_ratios(numerator: list[float], denominator: list[float]) -> list[float]:
    """a_i / b_i for the blocks both arms ran side by side (same repeat, same block index)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"paired arms ran {len(numerator)} and {len(denominator)} blocks")
    return [a / b for a, b in zip(numerator, denominator)]

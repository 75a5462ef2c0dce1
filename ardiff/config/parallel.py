"""`runtime.parallel`: how many processes run a job (ardiff.launch runs them).

    runtime:
      parallel: {workers: 2, cfg: 1, launcher: spawn, backend: auto, threads: auto,
                 timeout_s: 600}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictFloat, StrictInt, field_validator
from pydantic.dataclasses import dataclass

from ardiff.limits import MAX_TIMEOUT_S, MAX_WORKERS
from ardiff.text import short_repr

# As every section of ardiff.config.run: unknown keys are errors, docstrings describe fields.
_SECTION = ConfigDict(extra="forbid", use_attribute_docstrings=True)
Finite = Annotated[StrictFloat, Field(allow_inf_nan=False)]


@dataclass(frozen=True, config=_SECTION)
class ParallelConfig:
    """How many processes run the job (`ardiff.launch`): `workers` data-parallel replicas,
    each of `cfg` ranks (2: one CFG branch per rank), so `workers * cfg` ranks in all."""

    workers: Annotated[StrictInt, Field(gt=0, le=MAX_WORKERS)] = 1
    """Data-parallel replicas: replica r runs the prompts i with i % workers == r."""
    cfg: StrictInt = 1
    """Ranks per replica: 1, or 2 to run the positive and negative CFG branches side by side."""
    launcher: Literal["spawn", "env"] = "spawn"
    """spawn: ardiff starts the processes; env: torchrun did (RANK, WORLD_SIZE, ... are set)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; auto: nccl on CUDA, gloo on the CPU."""
    threads: Literal["auto"] | Annotated[StrictInt, Field(gt=0, le=MAX_WORKERS)] = "auto"
    """Intra-op threads per rank; auto: the host's cores / its ranks (at least 1)."""
    timeout_s: Annotated[Finite, Field(gt=0, le=MAX_TIMEOUT_S)] = 600.0
    """A rank silent this long (stuck, not slow to start) fails the job."""

    @field_validator("threads", mode="before")
    @classmethod
    def _is_auto_or_a_count(cls, threads: Any) -> Any:
        is_count = isinstance(threads, int) and not isinstance(threads, bool)
        if threads != "auto" and not (is_count and 0 < threads <= MAX_WORKERS):
            raise ValueError(f"{short_repr(threads)} is invalid; give a number of threads from "
                             f"1 to {MAX_WORKERS}, or auto (the host's cores / its ranks)")
        return threads

    @field_validator("cfg")
    @classmethod
    def _is_one_or_two(cls, cfg: int) -> int:
        if cfg not in (1, 2):
            raise ValueError(f"{cfg!r} is invalid; CFG-parallel splits the two guidance "
                             f"branches (positive, negative) over 2 ranks: use 1 or 2")
        return cfg

    @property
    def world_size(self) -> int:
        return self.workers * self.cfg

"""The tiny DiT with a fault on one rank of a parallel job, for tests/launch/.

`RankFaultDiT(fault=..., on_rank=r, at_block=b, ...)` is `TinyCausalDiT` (same weights, same
frames) except that on job rank r (torch.distributed's; 0 outside a job), at rollout block b,
`fault="raise"` raises RankFault and `fault="hang"` sleeps for an hour (a stuck rank); in
the `load` hook on rank r, `fault="load_raise"` raises RankFault and `fault="load_hang"`
sleeps for an hour (a rank that never finishes loading). `block_sleep_s` slows every rollout
block; `marker` names a file holding "<rollout blocks this process made> <its pid>" (written
atomically; first when `load_hang` starts); a `{rank}` in it becomes the rank. Loaded by file path
(`/abs/rank_pipelines.py:RankFaultDiT`) in spawned ranks and under torchrun.
"""

from __future__ import annotations

import os
import time

import ardiff
from ardiff.pipelines.tiny_dit import TinyCausalDiT


class RankFault(RuntimeError):
    """What RankFaultDiT raises on purpose."""


def job_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class RankFaultDiT(TinyCausalDiT):
    def __init__(self, fault: str | None = None, on_rank: int = 1, at_block: int = 3,
                 block_sleep_s: float = 0.0, marker: str | None = None, **config) -> None:
        super().__init__(**config)
        self.fault, self.on_rank, self.at_block = fault, on_rank, at_block
        self.block_sleep_s, self.marker, self.blocks_made = block_sleep_s, marker, 0

    def load(self, device, dtype) -> None:
        if self.fault in ("load_raise", "load_hang") and job_rank() == self.on_rank:
            if self.fault == "load_raise":
                raise RankFault(f"injected in load on rank {self.on_rank}")
            self._write_marker()
            time.sleep(3600)
        super().load(device, dtype)

    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        warmup = request.prompt == "warmup"
        if not warmup and request.block_index == self.at_block and job_rank() == self.on_rank:
            if self.fault == "raise":
                raise RankFault(f"injected at block {self.at_block} on rank {self.on_rank}")
            if self.fault == "hang":
                time.sleep(3600)
        output = super().generate_block(request, state)
        if not warmup:
            time.sleep(self.block_sleep_s)
            self._made_block()
        return output

    def _made_block(self) -> None:
        self.blocks_made += 1
        self._write_marker()

    def _write_marker(self) -> None:
        if self.marker:
            path = self.marker.format(rank=job_rank())
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as marker:
                marker.write(f"{self.blocks_made} {os.getpid()}")
            os.replace(tmp, path)

"""The tiny DiT with a fault on one rank of a parallel job, for tests/launch/.

`RankFaultDiT(fault=..., on_rank=r, at_block=b, ...)` is `TinyCausalDiT` (same weights, same
frames) except that on job rank r (torch.distributed's; 0 outside a job), at rollout block b,
`fault="raise"` raises RankFault and `fault="hang"` sleeps for an hour (a stuck rank).
`block_sleep_s` slows every rollout block; `marker` names a file holding the number of
rollout blocks this process made (written atomically). Loaded by file path
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
        if self.marker:
            tmp = f"{self.marker}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as marker:
                marker.write(str(self.blocks_made))
            os.replace(tmp, self.marker)

"""A rank's torch.distributed groups: the whole job, and its CFG group.

    groups = join_groups(rank, backend, init_method, timeout_s, device)
    groups.agree_min(capacity)        the minimum over every rank
    groups.cfg                        the CFG group (None when cfg == 1)
    leave_groups()                    tear down: peers blocked on this rank raise at once
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ardiff.distributed.context import PeerLostError
from ardiff.distributed.topology import RankInfo


@dataclass(frozen=True)
class Groups:
    rank: RankInfo
    cfg: Any          # the CFG group of this rank's replica, or None
    device: str       # where the tensors of a collective live (CUDA for nccl)

    def agree_min(self, value: int) -> int:
        """The minimum of `value` over every rank of the job."""
        return self.reduce(value, "MIN", None)

    def reduce(self, value: int, op: str, group: Any) -> int:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        try:
            dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), group=group)
        except Exception as exc:
            raise PeerLostError(f"rank {self.rank.rank}: a peer left while the ranks agreed "
                                f"({type(exc).__name__} from {dist.get_backend(group)})") from exc
        return int(tensor.item())


def join_groups(rank: RankInfo, backend: str, init_method: str, timeout_s: float,
                device: str, start_timeout_s: float) -> Groups:
    """Join the job's process group and create every CFG group (each rank creates all of
    them, in one order, as torch.distributed requires). The job's group, used while the
    ranks start (rendezvous, the capacity agreement), waits `start_timeout_s` for a peer;
    a CFG group, used every denoising step, `timeout_s`."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank.rank,
                            world_size=rank.world_size,
                            timeout=timedelta(seconds=start_timeout_s))
    mine = None
    if rank.cfg > 1:
        for replica in range(rank.workers):
            ranks = list(range(replica * rank.cfg, (replica + 1) * rank.cfg))
            group = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
            if replica == rank.replica:
                mine = group
    return Groups(rank, mine, device)


def leave_groups() -> None:
    """Destroy the process group if this process joined one (safe to call twice)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

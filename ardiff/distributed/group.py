"""A rank's torch.distributed groups: the whole job, and its CFG group.

    groups = join_groups(rank, backend, init_method, timeout_s, device, start_timeout_s)
    groups.agree_min(capacity)        the minimum over every rank (after each one loaded)
    groups.cfg                        the CFG group (None when cfg == 1)
    leave_groups()                    tear down: peers blocked on this rank raise at once

The ranks meet within `timeout_s` (a peer that never arrives, or a port in use, is a
RendezvousError then, not after the time a rank may take to load); what they agree on
after loading waits up to `start_timeout_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ardiff.distributed.context import PeerLostError
from ardiff.distributed.topology import RankInfo
from ardiff.errors import RunError
from ardiff.text import shorten


class RendezvousError(RunError):
    """The ranks of a job could not meet (exit 1)."""


@dataclass(frozen=True)
class Groups:
    rank: RankInfo
    cfg: Any          # the CFG group of this rank's replica, or None
    device: str       # where the tensors of a collective live (CUDA for nccl)
    job: Any = None   # every rank, waiting up to start_timeout_s (None: the default group)

    def agree_min(self, value: int) -> int:
        """The minimum of `value` over every rank of the job."""
        return self.reduce(value, "MIN", self.job)

    def reduce(self, value: int, op: str, group: Any) -> int:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        try:
            dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), group=group)
        except Exception as exc:
            raise PeerLostError(f"a peer left while the ranks agreed ({type(exc).__name__} "
                                f"from {dist.get_backend(group)})") from exc
        return int(tensor.item())


def join_groups(rank: RankInfo, backend: str, init_method: str, timeout_s: float,
                device: str, start_timeout_s: float) -> Groups:
    """Meet the other ranks within `timeout_s` (else RendezvousError) and create the job's
    group and every CFG group (each rank creates all of them, in one order, as
    torch.distributed requires). The job's group, used once every rank has loaded (the
    capacity agreement), waits `start_timeout_s` for a peer; a CFG group, used every
    denoising step, `timeout_s`."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank.rank,
                                world_size=rank.world_size, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:
        raise RendezvousError(_rendezvous_failure(init_method, timeout_s, exc)) from exc
    try:
        job = dist.new_group(list(range(rank.world_size)),
                             timeout=timedelta(seconds=start_timeout_s))
        mine = None
        for replica in range(rank.workers if rank.cfg > 1 else 0):
            ranks = list(range(replica * rank.cfg, (replica + 1) * rank.cfg))
            group = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
            if replica == rank.replica:
                mine = group
    except Exception as exc:
        raise PeerLostError(f"a peer left while the ranks made their groups "
                            f"({type(exc).__name__} from {backend})") from exc
    return Groups(rank, mine, device, job)


def _rendezvous_failure(init_method: str, timeout_s: float, exc: Exception) -> str:
    """One line: where the ranks were to meet, what went wrong, what to do."""
    what = f"{type(exc).__name__}: {shorten(' '.join(str(exc).split()).rstrip('.'))}"
    where = f"could not meet the other ranks at {init_method}"
    if "EADDRINUSE" in what or "address already in use" in what.lower():
        return (f"{where}: the port is in use ({what}); free it or choose another "
                f"(torchrun: --master_port; a spawned job picks one itself: run it again)")
    if "timed out" in what.lower() or "timeout" in what.lower():
        return (f"{where} within runtime.parallel.timeout_s ({timeout_s:g} s): {what}; start "
                f"every rank (torchrun: --nnodes, --nproc_per_node), or raise "
                f"runtime.parallel.timeout_s")
    return f"{where}: {what}"


def leave_groups() -> None:
    """Destroy the process group if this process joined one (safe to call twice)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

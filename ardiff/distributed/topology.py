"""Who is who in a parallel job: ranks, replicas, CFG groups, devices, threads, budgets.

    workers = 2, cfg = 2  ->  4 ranks
    rank      0   1   2   3
    replica   0   0   1   1       replica r runs the streams i with i % workers == r
    cfg_rank  0   1   0   1       branch positive / negative; cfg_rank 0 writes the files

Pure integers and strings: no process, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ardiff.config.parallel import ParallelConfig
from ardiff.errors import ConfigError
from ardiff.sizes import MemoryBudget


@dataclass(frozen=True)
class RankInfo:
    """One rank's place in the job."""

    rank: int
    workers: int
    cfg: int
    local_rank: int
    local_world_size: int

    @property
    def world_size(self) -> int:
        return self.workers * self.cfg

    @property
    def replica(self) -> int:
        return self.rank // self.cfg

    @property
    def cfg_rank(self) -> int:
        return self.rank % self.cfg

    @property
    def writes(self) -> bool:
        """The first rank of a CFG group encodes its replica's files."""
        return self.cfg_rank == 0

    @property
    def cfg_group_ranks(self) -> list[int]:
        return list(range(self.replica * self.cfg, (self.replica + 1) * self.cfg))

    def streams(self, num_streams: int) -> list[int]:
        return replica_streams(self.replica, self.workers, num_streams)


def replica_streams(replica: int, workers: int, num_streams: int) -> list[int]:
    """The stream indices a replica runs: i % workers == replica."""
    return [i for i in range(num_streams) if i % workers == replica]


def local_ranks(parallel: ParallelConfig) -> list[RankInfo]:
    """Every rank of a job spawned on this host."""
    world = parallel.world_size
    return [RankInfo(rank, parallel.workers, parallel.cfg, rank, world) for rank in range(world)]


def check_streams(workers: int, num_streams: int) -> None:
    """Every replica needs a stream: more workers than prompts is a usage error."""
    if workers > num_streams:
        raise ConfigError(f"runtime.parallel.workers: {workers} replicas for {num_streams} "
                          f"prompt(s) would leave {workers - num_streams} idle; use at most "
                          f"{num_streams} (or give more prompts)")


def rank_device(device: str, local_rank: int) -> str:
    """The device a rank runs on: the CPU, or `cuda:local_rank` (one device per rank)."""
    return "cpu" if device == "cpu" else f"cuda:{local_rank}"


def check_devices(device: str, local_world_size: int, cuda_devices: int) -> None:
    """A CUDA job needs one device per rank on this host (exit 2 before anything starts)."""
    if device != "cpu" and local_world_size > cuda_devices:
        raise ConfigError(f"runtime.parallel: {local_world_size} ranks on this host need "
                          f"{local_world_size} CUDA devices (one per rank), but it has "
                          f"{cuda_devices}; lower runtime.parallel.workers or cfg, or use "
                          f"--device cpu")


def pick_backend(backend: str, device: str) -> str:
    """`auto`: nccl on CUDA, gloo on the CPU (the CPU build of torch has no nccl)."""
    if backend == "auto":
        return "gloo" if device == "cpu" else "nccl"
    if backend == "nccl" and device == "cpu":
        raise ConfigError("runtime.parallel.backend: 'nccl' needs CUDA devices, but "
                          "runtime.device is cpu; use auto or gloo")
    return backend


def rank_threads(threads: int | str, cores: int, local_world_size: int) -> int:
    """Intra-op threads of a rank: the setting, or `auto` = cores / ranks on this host
    (ranks whose threads outnumber the cores run far slower: docs/several-devices.md)."""
    if threads != "auto":
        return int(threads)
    return max(1, cores // local_world_size)


def rank_budget(budget: MemoryBudget, device: str, local_world_size: int) -> MemoryBudget:
    """A rank's share of the memory budget: ranks on the CPU share the host's memory, so a
    fraction of it is split between them; a byte budget, or a device of its own, is kept."""
    if budget.fraction is None or device != "cpu" or local_world_size == 1:
        return budget
    return MemoryBudget(fraction=budget.fraction / local_world_size)

"""The one place ardiff reads the environment: the variables `torchrun` sets for each rank.

`runtime.parallel.launcher: env` means another tool started the processes (torchrun, or
a cluster's launcher that sets the same variables). torch.distributed's `env://` reads
MASTER_ADDR and MASTER_PORT itself; this reads which rank this process is.
"""

from __future__ import annotations

from typing import Mapping

from ardiff.config.parallel import ParallelConfig
from ardiff.distributed.topology import RankInfo
from ardiff.errors import ConfigError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")


def rank_from_env(parallel: ParallelConfig, environ: Mapping[str, str]) -> RankInfo:
    """This process's rank from torchrun's variables (pass `os.environ`); the world size
    sets the workers (`world_size / cfg`). Raises ConfigError when they are missing or
    disagree with the config."""
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise ConfigError(f"runtime.parallel.launcher: env needs the variables torchrun sets "
                          f"(missing: {', '.join(missing)}); start ardiff with torchrun, or "
                          f"use launcher: spawn")
    values = {name: _integer(environ, name) for name in TORCHRUN_VARIABLES[:4]}
    world = values["WORLD_SIZE"]
    if world % parallel.cfg or parallel.workers not in (1, world // parallel.cfg):
        raise ConfigError(f"runtime.parallel: torchrun started {world} ranks, which is not "
                          f"workers ({parallel.workers}) x cfg ({parallel.cfg}); leave "
                          f"workers at 1 (torchrun's count decides) or match --nproc_per_node")
    return RankInfo(values["RANK"], world // parallel.cfg, parallel.cfg, values["LOCAL_RANK"],
                    values["LOCAL_WORLD_SIZE"])


def _integer(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    if not text.isdigit():
        raise ConfigError(f"runtime.parallel.launcher: env: {name}={text!r} is not a rank "
                          f"count or index; check how the processes were started")
    return int(text)

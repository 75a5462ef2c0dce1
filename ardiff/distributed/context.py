"""What a pipeline sees of CFG-parallel: the branch it runs and an all-gather of a prediction.

Under `runtime.parallel.cfg: 2` the two guidance branches run one per rank of a CFG group,
both at `local_index` 0 (the upstream contract allows a shared slot "when each worker
executes only one branch"). Each denoising step every rank predicts its branch, all-gathers
(rank order = branch order) and mixes the guidance, so every rank holds the same latents:

    rank 0:  predict(positive) --+-- all_gather --> [pos, neg] --> mix --> same x
    rank 1:  predict(negative) --+

A pipeline that supports it implements `bind_ar_diffusion_parallel(context)`; the build
calls it before reading the spec, so the spec can declare `cfg_branch_specs(world_size)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ardiff.contract.spec import ARDiffusionKVBranchSpec, ARDiffusionKVCacheSpec
from ardiff.errors import ConfigError, RunError

CFG_BRANCHES = ("positive", "negative")


class PeerLostError(RunError):
    """A collective failed because a peer rank left (failed, stopped or was stopped)."""


def cfg_branch_specs(cfg_world_size: int = 1) -> tuple[ARDiffusionKVBranchSpec, ...]:
    """The upstream-style `kv_branches` of a guided pipeline: in one process both branches
    have their own slot (0, 1); under CFG-parallel each rank runs one, so both share slot 0."""
    if cfg_world_size not in (1, 2):
        raise ConfigError(f"runtime.parallel.cfg: {cfg_world_size!r} is invalid; use 1 or 2")
    return tuple(ARDiffusionKVBranchSpec(name, 0 if cfg_world_size == 2 else index)
                 for index, name in enumerate(CFG_BRANCHES))


@dataclass(frozen=True)
class ParallelContext:
    """A rank's place in its CFG group. `group` is the torch.distributed group (None in a
    dry run such as `inspect-spec`, where nothing is gathered)."""

    rank: int                 # in the CFG group: the index of the branch this rank runs
    world_size: int           # ranks of the CFG group (2 under CFG-parallel)
    group: Any = None
    global_rank: int = 0      # in the whole job

    @property
    def branch(self) -> str:
        """The CFG branch this rank runs."""
        return CFG_BRANCHES[self.rank]

    def all_gather(self, tensor: Any) -> list[Any]:
        """Every rank's `tensor` (same shape on all), in rank order; raises PeerLostError
        when a peer left the group (it failed or was stopped)."""
        import torch
        import torch.distributed as dist

        if self.group is None:
            raise RunError("ParallelContext.all_gather: no process group (a dry run); the "
                           "build binds a live context only inside a worker")
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        try:
            dist.all_gather(gathered, tensor.contiguous(), group=self.group)
        except Exception as exc:  # gloo/nccl raise RuntimeError subclasses when a peer goes
            raise PeerLostError(f"a peer of its CFG group left during an all-gather "
                                f"({type(exc).__name__} from "
                                f"{dist.get_backend(self.group)})") from exc
        return gathered


def bind_parallel(pipeline: Any, cfg: int,
                  context: ParallelContext | None = None) -> ParallelContext | None:
    """Give a pipeline its CFG-parallel context (a dry-run one for rank 0 when None), before
    its spec is read, and return it; refuse a pipeline that cannot run one branch per rank
    (exit 2). cfg 1: nothing to bind (None)."""
    if cfg == 1:
        return None
    hook = getattr(pipeline, "bind_ar_diffusion_parallel", None)
    if not callable(hook):
        raise ConfigError(f"runtime.parallel.cfg: {cfg} needs a pipeline that runs one CFG "
                          f"branch per rank (bind_ar_diffusion_parallel); "
                          f"{type(pipeline).__name__} has none; set runtime.parallel.cfg: 1")
    context = context or ParallelContext(rank=0, world_size=cfg)
    hook(context)
    return context


def check_cfg_spec(spec: ARDiffusionKVCacheSpec, cfg: int, guidance_scale: float) -> None:
    """Under CFG-parallel the spec must declare two branches on one slot, and guidance must
    be on (else the second rank would have nothing to run)."""
    if cfg == 1:
        return
    names = [branch.name for branch in spec.kv_branches]
    if len(names) != cfg or spec.num_local_kv_branches != 1:
        raise ConfigError(f"runtime.parallel.cfg: {cfg} runs one CFG branch per rank, but the "
                          f"pipeline declares {len(names)} branch(es) {names} on "
                          f"{spec.num_local_kv_branches} slot(s); enable its guidance branches "
                          f"(e.g. pipeline.args.cfg: true) or set runtime.parallel.cfg: 1")
    if guidance_scale <= 1.0:
        raise ConfigError(f"runtime.parallel.cfg: {cfg} runs the negative branch on its own "
                          f"rank, but rollout.guidance_scale is {guidance_scale:g} (no "
                          f"guidance); raise rollout.guidance_scale above 1 or set "
                          f"runtime.parallel.cfg: 1")

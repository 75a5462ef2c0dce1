"""ardiff: a model-neutral runtime for autoregressive (block-causal) video diffusion.

    report = ardiff.run_job(ardiff.load_config("run.yaml"))   # what `ardiff rollout` runs
    with ardiff.open("run.yaml") as run:                      # frames in memory (docs/python.md)
        for block in run.blocks(frames=24): block.frames      # numpy uint8 [F, H, W, 3]

Pipelines implement the upstream `SupportsARDiffusionPipeline` contract plus ardiff's
`generate_block` (`SupportsARDiffusionBlockGeneration`) and declare their KV geometry with
an `ARDiffusionKVCacheSpec`; ardiff plans and owns the cache, the sessions, the rollout
loop and the video. Everything a pipeline or a script needs is exported here.
"""

from ardiff.contract import (
    ARDiffusionCrossAttentionKVSpec,
    ARDiffusionKVBatchBlock,
    ARDiffusionKVBlock,
    ARDiffusionKVBranchSpec,
    ARDiffusionKVCacheSpec,
    ARDiffusionKVState,
    ARDiffusionKVStateBatch,
    BlockOutput,
    PipelineInputs,
    RolloutRequest,
    SupportsARDiffusionBatchGeneration,
    SupportsARDiffusionBlockGeneration,
    SupportsARDiffusionPipeline,
    SupportsARDiffusionWarmup,
)
from ardiff.contract.base import ARDiffusionPipelineBase
from ardiff.distributed.context import ParallelContext, PeerLostError, cfg_branch_specs
from ardiff.errors import (
    ArdiffError,
    ArdiffWarning,
    BlockOutputError,
    CapacityError,
    ConfigError,
    EncoderError,
    KVStateError,
    OutputPathError,
    PipelineError,
    PipelineLoadError,
    RunError,
    SessionError,
    SpecError,
    WarmupError,
)

__version__ = "0.1.0"

# Exported lazily: they import torch, and `ardiff --help` / `inspect-spec` must not.
_LAZY = {
    "Runner": "ardiff.engine.runner", "BlockResult": "ardiff.engine.runner",
    "build_runner": "ardiff.engine.build", "inspect_spec": "ardiff.engine.build",
    "run_rollout": "ardiff.rollout.job", "run_job": "ardiff.launch.job",
    "ProgressEvent": "ardiff.rollout.progress", "RolloutStop": "ardiff.rollout.stop",
    "RolloutReport": "ardiff.rollout.report",
    "load_config": "ardiff.config.run", "build_config": "ardiff.config.run",
    "RunConfig": "ardiff.config.run",
    "open": "ardiff.api.run:open_run", "Run": "ardiff.api.run", "Session": "ardiff.api.session",
    "Block": "ardiff.api.session",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, _, attr = _LAZY[name].partition(":")
        return getattr(importlib.import_module(module), attr or name)
    raise AttributeError(f"module 'ardiff' has no attribute {name!r}")


__all__ = [
    "ARDiffusionCrossAttentionKVSpec", "ARDiffusionKVBranchSpec", "ARDiffusionKVCacheSpec",
    "SupportsARDiffusionPipeline", "SupportsARDiffusionWarmup",
    "SupportsARDiffusionBlockGeneration", "ARDiffusionKVState", "ARDiffusionKVBlock",
    "SupportsARDiffusionBatchGeneration", "ARDiffusionKVStateBatch", "ARDiffusionKVBatchBlock",
    "RolloutRequest", "BlockOutput", "PipelineInputs", "ARDiffusionPipelineBase",
    "ArdiffError", "ArdiffWarning", "ConfigError", "SpecError", "PipelineLoadError", "OutputPathError",
    "CapacityError", "RunError", "KVStateError", "SessionError", "BlockOutputError",
    "PipelineError", "WarmupError", "EncoderError",
    "ParallelContext", "PeerLostError", "cfg_branch_specs",
    *_LAZY,
]

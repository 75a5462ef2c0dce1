"""ardiff: a model-neutral runtime for autoregressive (block-causal) video diffusion.

Pipelines implement `SupportsARDiffusionPipeline` and declare their KV geometry
with an `ARDiffusionKVCacheSpec`; ardiff plans and owns the cache, the
sessions, the rollout loop and the video. Everything a pipeline or a script
needs is exported here.
"""

from ardiff.errors import (ArdiffError, BlockOutputError, CapacityError, ConfigError,
                           EncoderError, KVStateError, PipelineError, PipelineLoadError,
                           RunError, SessionError, SpecError, WarmupError)
from ardiff.request import BlockOutput, RolloutRequest
from ardiff.spec import (ARDiffusionCrossAttentionKVSpec, ARDiffusionKVBranchSpec,
                         ARDiffusionKVCacheSpec, SupportsARDiffusionPipeline,
                         SupportsARDiffusionWarmup)

__version__ = "0.1.0"

# Exported lazily: they import torch, and `ardiff --help` / `inspect-spec` must not.
_LAZY = {"Runner": "ardiff.runner", "run_rollout": "ardiff.job", "load_config": "ardiff.config",
         "build_config": "ardiff.config", "RunConfig": "ardiff.config"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ardiff' has no attribute {name!r}")

__all__ = [
    "ARDiffusionCrossAttentionKVSpec", "ARDiffusionKVBranchSpec", "ARDiffusionKVCacheSpec",
    "SupportsARDiffusionPipeline", "SupportsARDiffusionWarmup", "RolloutRequest", "BlockOutput",
    "ArdiffError", "ConfigError", "SpecError", "PipelineLoadError", "CapacityError", "RunError",
    "KVStateError", "SessionError", "BlockOutputError", "PipelineError", "WarmupError",
    "EncoderError", "Runner", "run_rollout", "load_config", "build_config", "RunConfig",
]

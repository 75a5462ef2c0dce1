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

__all__ = [
    "ARDiffusionCrossAttentionKVSpec", "ARDiffusionKVBranchSpec", "ARDiffusionKVCacheSpec",
    "SupportsARDiffusionPipeline", "SupportsARDiffusionWarmup", "RolloutRequest", "BlockOutput",
    "ArdiffError", "ConfigError", "SpecError", "PipelineLoadError", "CapacityError", "RunError",
    "KVStateError", "SessionError", "BlockOutputError", "PipelineError", "WarmupError",
    "EncoderError",
]

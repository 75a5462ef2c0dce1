"""The pipeline contract: the upstream spec and protocols (`spec`), ardiff's forward (`forward`)."""

from typing import Protocol

from ardiff.contract.forward import (
    ARDiffusionKVBatchBlock,
    ARDiffusionKVBlock,
    ARDiffusionKVState,
    ARDiffusionKVStateBatch,
    BlockOutput,
    RolloutRequest,
    SupportsARDiffusionBatchGeneration,
    SupportsARDiffusionBlockGeneration,
)
from ardiff.contract.inputs import PipelineInputs, get_pipeline_inputs
from ardiff.contract.spec import (
    ARDiffusionCrossAttentionKVSpec,
    ARDiffusionKVBranchSpec,
    ARDiffusionKVCacheSpec,
    SupportsARDiffusionPipeline,
    SupportsARDiffusionWarmup,
)

# Every method a pipeline must have: the upstream protocol's, then ardiff's forward.
PIPELINE_METHODS = ("ar_diffusion_kv_cache_spec", "bind_ar_diffusion_state",
                    "reset_ar_diffusion_session", "close_ar_diffusion_session", "generate_block")


class ARDiffusionPipeline(SupportsARDiffusionPipeline, SupportsARDiffusionBlockGeneration,
                          Protocol):
    """What ardiff runs: the upstream protocol and ardiff's forward (`PIPELINE_METHODS`).
    The loader checks the methods of what a config builds; this type is what it returns."""


def missing_pipeline_methods(obj: object) -> list[str]:
    """Names of the required methods `obj` lacks, in `PIPELINE_METHODS` order (empty: none)."""
    return [name for name in PIPELINE_METHODS if not callable(getattr(obj, name, None))]


__all__ = [
    "ARDiffusionCrossAttentionKVSpec", "ARDiffusionKVBranchSpec", "ARDiffusionKVCacheSpec",
    "SupportsARDiffusionPipeline", "SupportsARDiffusionWarmup",
    "SupportsARDiffusionBlockGeneration", "ARDiffusionKVState", "ARDiffusionKVBlock",
    "SupportsARDiffusionBatchGeneration", "ARDiffusionKVStateBatch", "ARDiffusionKVBatchBlock",
    "RolloutRequest", "BlockOutput", "ARDiffusionPipeline", "PIPELINE_METHODS",
    "missing_pipeline_methods", "PipelineInputs", "get_pipeline_inputs",
]

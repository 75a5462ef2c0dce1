"""`ARDiffusionPipelineBase`: the contract's defaults, for a pipeline to subclass (optional).

    class MyModel(ardiff.ARDiffusionPipelineBase):
        def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec: ...
        def generate_block(self, request, state: ardiff.ARDiffusionKVState): ...

It adds a no-op `load`, a `nullcontext` bind, no-op session hooks, `warmup_requests` as
the warmup (set `ar_diffusion_warmup_requests = None` for none) and no declared input files
(`ar_diffusion_input_paths`: what `load` reads, which no output may be). ardiff checks methods,
never this class: a pipeline written from the upstream contract alone loads just the same.
Hooks ardiff also looks for, with no default here: `compile_layers`, `action_names`,
`bind_ar_diffusion_parallel`, `video_frames_per_latent_frame`, `reference_loop` (bench), and
for the weights beside the KV plan (docs/writing-a-pipeline.md#weights-and-where-they-live):

    weight_bytes(dtype: str) -> Mapping[str, int]       bytes per part in the run's dtype,
                                                       from configs (before load: no weights)
    place_weights(device: str, fits) -> Mapping[str, str]   each part's device, given
                                                       fits(parts) -> bool; kept for load
    model_layout: str                                  the folder layout it loads (shown)
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from ardiff.contract.forward import ARDiffusionKVState, BlockOutput, RolloutRequest
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.sizes import ceil_div

if TYPE_CHECKING:  # pragma: no cover - typing only; importing torch here would slow the CLI
    import torch

# Any scale > 1: warmup runs both CFG branches of a pipeline that declares them.
WARMUP_GUIDANCE = 3.0


def warmup_blocks(spec: ARDiffusionKVCacheSpec) -> int:
    """Blocks that fill the sink and the window, plus one that evicts: after them every
    code path of a block (empty, partial and full window, eviction) has run once."""
    return ceil_div(spec.sink_frames + spec.window_frames, spec.frames_per_block) + 1


def warmup_requests(spec: ARDiffusionKVCacheSpec, session_id: str,
                    guided: bool = False) -> list[RolloutRequest]:
    """`warmup_blocks(spec)` requests for `session_id`, the first resetting it; `guided` runs
    them with guidance, so both CFG branches are exercised."""
    guidance = WARMUP_GUIDANCE if guided else 1.0
    return [RolloutRequest(session_id, block_index=i, prompt="warmup", seed=0,
                           guidance_scale=guidance, reset=i == 0)
            for i in range(warmup_blocks(spec))]


class ARDiffusionPipelineBase(abc.ABC):
    """The upstream protocol's hooks and ardiff's `load` and warmup, as defaults.

    A subclass defines the spec and `generate_block` (constructing one without them raises
    TypeError) and overrides a default where it keeps model state per session."""

    @abc.abstractmethod
    def ar_diffusion_kv_cache_spec(self) -> ARDiffusionKVCacheSpec:
        """The KV geometry and session policy; the runner plans the cache from it."""

    @abc.abstractmethod
    def generate_block(self, request: RolloutRequest,
                       state: ARDiffusionKVState) -> BlockOutput:
        """The next AR block of `request.session_id`, through `state` (valid in the bind)."""

    def load(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """Weights onto `device` in `dtype`, called once before anything runs: none here."""

    def bind_ar_diffusion_state(self, session_id: str,
                                state: ARDiffusionKVState) -> AbstractContextManager[None]:
        """The state reaches generate_block as its argument: nothing to bind."""
        return contextlib.nullcontext()

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        """Drop the session's model-owned state after its KV was released: none here."""

    def close_ar_diffusion_session(self, session_id: str) -> None:
        """Drop the session's model-owned state after close, eviction or a failure: none here."""

    def ar_diffusion_input_paths(self) -> Mapping[str, str | os.PathLike[str] | None]:
        """The files and folders `load` reads, by a name shown in messages (e.g.
        {'pipeline.args.model_dir': path}; None: not used). A run refuses, before any work,
        an output that is one of them or an existing file inside such a folder: none here."""
        return {}

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[RolloutRequest]:
        """Enough unguided blocks to fill the sink and the window and evict once."""
        return warmup_requests(self.ar_diffusion_kv_cache_spec(), session_id)

"""The hand-written loop `ardiff bench` holds ardiff to: the pipeline's own, if it has one.

    pipeline.reference_loop(spec) -> a fresh loop, or a str saying why there is none

A loop runs over the pipeline's loaded weights with `spec`'s window and sink, so the ratio
of the two arms is what ardiff's runtime (runner, sessions, KV state, checks) costs beside
plain code; `loop.step(request)` makes the next block's frames. The hook is optional.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ardiff.contract.forward import RolloutRequest
from ardiff.contract.spec import ARDiffusionKVCacheSpec

NO_LOOP = "no hand-written loop ships for this pipeline"
NO_RESET_LOOP = "the reference loops keep a sliding window, not reset_at_boundary"


class ReferenceLoop(Protocol):
    """One session's rollout written by hand: `step` makes the next block, uint8 frames."""

    def step(self, request: RolloutRequest) -> Any: ...


def reference_loop(pipeline: Any, spec: ARDiffusionKVCacheSpec
                   ) -> tuple[Callable[[], ReferenceLoop] | None, str | None]:
    """(a factory of fresh loops for `pipeline` under the effective `spec`, None) or (None,
    why there is none)."""
    if spec.reset_at_boundary:
        return None, NO_RESET_LOOP
    hook = getattr(pipeline, "reference_loop", None)
    if not callable(hook):
        return None, NO_LOOP
    first = hook(spec)
    if isinstance(first, str):
        return None, first
    return (lambda: hook(spec)), None

"""Hand-written loops `ardiff bench` holds ardiff to, by pipeline: one per shipped model that has one.

A loop runs over the pipeline's own loaded weights, so the ratio of the two arms is what
ardiff's runtime (runner, sessions, KV state, checks) costs beside plain code.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


def reference_loop(pipeline: Any, spec: Any) -> Callable[[], Any] | None:
    """A factory of fresh reference loops for `pipeline` under the effective `spec` (window
    and sink overrides applied), or None when no loop ships for this pipeline."""
    from ardiff.pipelines.bouncing.pipeline import BouncingWorld

    if isinstance(pipeline, BouncingWorld):
        from ardiff.pipelines.bouncing.reference import ReferenceLoop

        config = dataclasses.replace(pipeline.config, window_frames=spec.window_frames,
                                     sink_frames=spec.sink_frames)
        return lambda: ReferenceLoop(pipeline.model, config)
    return None

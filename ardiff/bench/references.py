"""Hand-written loops `ardiff bench` holds ardiff to, by pipeline: one per shipped model.

A loop runs over the pipeline's own loaded weights, so the ratio of the two arms is what
ardiff's runtime (runner, sessions, KV state, checks) costs beside plain code. Each loop
has `step(request) -> frames` and covers the settings its docstring names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

NO_LOOP = "no hand-written loop ships for this pipeline"


def reference_loop(pipeline: Any, spec: Any) -> tuple[Callable[[], Any] | None, str | None]:
    """(a factory of fresh loops for `pipeline` under the effective `spec`, None) or (None,
    why there is none)."""
    from ardiff.pipelines.bouncing.pipeline import BouncingWorld
    from ardiff.pipelines.tiny_dit import TinyCausalDiT

    if spec.reset_at_boundary:
        return None, "the reference loops keep a sliding window, not reset_at_boundary"
    window = {"window_frames": spec.window_frames, "sink_frames": spec.sink_frames}
    if isinstance(pipeline, BouncingWorld):
        from ardiff.pipelines.bouncing.reference import ReferenceLoop

        config = dataclasses.replace(pipeline.config, **window)
        return (lambda: ReferenceLoop(pipeline.model, config)), None
    if isinstance(pipeline, TinyCausalDiT):
        if pipeline.config.cfg:
            return None, "the tiny DiT's reference loop runs one branch (pipeline.args.cfg: false)"
        from ardiff.pipelines.tiny_dit_reference import TinyDiTLoop

        config = dataclasses.replace(pipeline.config, **window)
        return (lambda: TinyDiTLoop(pipeline, config)), None
    return None, NO_LOOP

"""A trained world model: coloured balls bouncing in a box and a sprite steered by actions.

The default video of `ardiff rollout` (entry point `ardiff.pipelines.bouncing:BouncingWorld`,
registered as `bouncing`). Its experiment log, numbers and known limits are in README.md
beside this file.

    config.py      BouncingConfig: architecture, window, sampling (the `pipeline.args`)
    model.py       the network (BouncingDiT), its KV-cache and block-causal-mask paths
    checkpoint.py  weights on disk (bf16 safetensors); the shipped ones are in weights/
    pipeline.py    BouncingWorld: the ardiff pipeline (start frames, sampler, video)
    sim.py         the simulator that renders the start frames and makes the training data
    locator.py     finds the balls and the sprite in frames again, by colour
    train.py       python -m ardiff.pipelines.bouncing.train     (writes weights/)
    evaluate.py    python -m ardiff.pipelines.bouncing.evaluate  (the README's numbers)
"""

from __future__ import annotations

# BouncingWorld is imported on first use, not here: `python -m ...bouncing.train` must set
# OMP_WAIT_POLICY before torch (imported by the pipeline) loads its OpenMP runtime.
_LAZY = {"BouncingWorld": "ardiff.pipelines.bouncing.pipeline",
         "BouncingConfig": "ardiff.pipelines.bouncing.config"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)

"""A trained world model: coloured balls bouncing in a box and a sprite steered by actions.

The default video of `ardiff rollout` (registered as `bouncing`); its experiment log,
numbers and known limits are in README.md beside this file.

    config.py  model.py  checkpoint.py   BouncingConfig, the network, its weights (weights/)
    pipeline.py   BouncingWorld: the ardiff pipeline (start frames, sampler, video)
    sim.py        the simulator that renders the start frames (and the training data)
    reference.py  the same rollout written by hand, for `ardiff bench`
    training/     what only trains and measures; train.py and evaluate.py run it
                  (python -m ardiff.pipelines.bouncing.train | .evaluate)
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

"""The tiny causal video DiT, untrained (registered as `tiny-dit`).

    model.py      TinyDiTConfig (the `pipeline.args`) and the network
    pipeline.py   TinyCausalDiT: the pipeline (sampler, CFG, prompt K/V, video)
    decoder.py    latents -> RGB, with per-session state;  text.py  the byte-level text encoder
    reference.py  the same rollout written by hand, for `ardiff bench`
"""

from ardiff.pipelines.tiny_dit.model import TinyDiTConfig
from ardiff.pipelines.tiny_dit.pipeline import TinyCausalDiT

__all__ = ["TinyCausalDiT", "TinyDiTConfig"]

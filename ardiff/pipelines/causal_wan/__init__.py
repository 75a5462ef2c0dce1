"""The causal-Wan family (Self-Forcing, CausVid, LongLive) on diffusers, from local weights.

Registered as the `causal-wan` pipeline. Needs the `wan` extra (`pip install
'ardiff[wan]'`: diffusers, transformers) to load; building it and `inspect-spec` read two
config.json files only. `python -m ardiff.pipelines.causal_wan.make_tiny --out DIR`
writes a tiny random model folder for tests and CI.
"""

from ardiff.pipelines.causal_wan.pipeline import CausalWan

__all__ = ["CausalWan"]

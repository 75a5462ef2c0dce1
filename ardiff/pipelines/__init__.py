"""The pipelines that ship with ardiff (registered in the `ardiff.pipelines` entry-point group).

    bouncing/     the default: a trained world model (its training apart, in training/)
    tiny_dit/     a tiny untrained causal video DiT, with CFG
    causal_wan/   Self-Forcing / CausVid / LongLive on diffusers, from local weights
    synthetic.py  attention only, any KV geometry: for benchmarks
    shared/       what they share: model parts, the sampler, the reference loops' K/V ring

Each model package holds its pipeline and, where one ships, its hand-written reference
loop (`reference.py`, returned by the pipeline's `reference_loop(spec)` for `ardiff bench`).
"""

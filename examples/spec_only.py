"""A pipeline that only declares the KV geometry of a public model: Wan2.1-T2V-1.3B, causal.

This is the geometry Self-Forcing and CausVid run (480x832 video -> 60x104
latents, 2x2 patches -> 1560 tokens per latent frame; 30 layers of 12 heads of
128; 3 latent frames per AR block; a 21-frame window; 512 text tokens of
cross-attention) and the bytes its weights take. No weights: it exists so that `ardiff
inspect-spec` can show what such a model costs on a given machine. `generate_block`
refuses to run.

    ardiff inspect-spec examples/wan_spec_only.yaml --budget 40GiB
"""

from __future__ import annotations

import ardiff

WAN_1_3B = dict(num_layers=30, num_kv_heads=12, head_size=128, tokens_per_frame=1560,
                frames_per_block=3)
TEXT_TOKENS = 512   # umT5 context length used by Wan's cross-attention
ROPE_FRAMES = 1024  # Wan's rotary table covers 1024 positions along time
# Bytes of the three models in bfloat16, as ardiff.pipelines.causal_wan counts them.
WAN_1_3B_BF16_BYTES = {"transformer": 2_844_248_192, "text_encoder": 11_361_820_672,
                       "vae": 253_785_062}


class WanSpecOnly(ardiff.ARDiffusionPipelineBase):
    """Declares the Wan2.1-1.3B causal geometry; has no weights."""

    ar_diffusion_warmup_requests = None  # no warmup: there is nothing to run

    def __init__(self, window_frames: int = 21, sink_frames: int = 0, cfg: bool = False,
                 session_capacity: int = 4):
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        self.cfg = cfg
        self.session_capacity = session_capacity

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        names = ("positive", "negative") if self.cfg else ("main",)
        return ardiff.ARDiffusionKVCacheSpec(
            **WAN_1_3B,
            window_frames=self.window_frames,
            sink_frames=self.sink_frames,
            session_capacity=self.session_capacity,
            max_model_len=ROPE_FRAMES,
            kv_branches=tuple(ardiff.ARDiffusionKVBranchSpec(name, i) for i, name in enumerate(names)),
            cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec("text", TEXT_TOKENS),),
        )

    def weight_bytes(self, dtype: str) -> dict[str, int]:
        """What Wan2.1-1.3B's weights take (its bfloat16 sizes, scaled to `dtype`): the fit
        counts them; a pipeline that declares none gets no fit verdict."""
        scale = {"bfloat16": 1.0, "float16": 1.0, "float32": 2.0}[dtype]
        return {name: int(n * scale) for name, n in WAN_1_3B_BF16_BYTES.items()}

    def activation_bytes(self, dtype: str) -> int:
        """One block's activations beside the weights (a VAE decode at 832x480): an estimate."""
        return 2 * 2**30

    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        raise NotImplementedError("WanSpecOnly declares a geometry only; it has no weights")

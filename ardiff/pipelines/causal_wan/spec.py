"""The causal-Wan KV spec, derived from the model's configs and the resolution alone.

    tokens_per_frame  (height / 8 / 2) * (width / 8 / 2)   VAE spatial factor x patch size
    num_layers, num_kv_heads, head_size                     the transformer config
    cross_attention   "text": text_len tokens (the prompt's K/V per layer)
    max_model_len     the rows of the model's rotary time table (1024 latent frames)
    model-owned state one session's streaming-decode cache, in the VAE's dtype, and the
                      float32 clean latents of its kept frames (for a recache)

At 832x480 for Wan2.1-T2V-1.3B: 1560 tokens per frame, 30 layers, 12 heads of 128,
1.76 GiB of decode cache per session in bfloat16.
"""

from __future__ import annotations

import ardiff
from ardiff.dtypes import DTYPE_BYTES
from ardiff.pipelines.causal_wan.config import CausalWanConfig
from ardiff.pipelines.causal_wan.decode import decode_cache_bytes
from ardiff.pipelines.causal_wan.recache import kept_latents_bytes

TEXT_CACHE = "text"


def build_spec(c: CausalWanConfig) -> ardiff.ARDiffusionKVCacheSpec:
    t = c.transformer
    return ardiff.ARDiffusionKVCacheSpec(
        num_layers=t.num_layers, num_kv_heads=t.num_heads, head_size=t.head_size,
        tokens_per_frame=c.tokens_per_frame, frames_per_block=c.frames_per_block,
        window_frames=c.window_frames, sink_frames=c.sink_frames,
        session_capacity=c.session_capacity, max_model_len=t.rope_frames,
        kv_branches=tuple(ardiff.ARDiffusionKVBranchSpec(name, index)
                          for index, name in enumerate(c.branch_names)),
        cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec(TEXT_CACHE, c.text_len),),
        model_owned_state_bytes_per_session=decode_cache_bytes(
            c.vae, c.latent_height, c.latent_width, DTYPE_BYTES[c.vae_dtype])
        + kept_latents_bytes(c),
    )

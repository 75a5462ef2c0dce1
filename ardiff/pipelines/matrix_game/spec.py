"""The matrix-game KV spec, from the checkpoint's config, the VAE's and the resolution.

    tokens_per_frame  (height / 16) * (width / 16): 880 at 352 x 640
    window_frames     the checkpoint's local_attn_size (6 universal / templerun, 4 gta_drive),
                      counting the block; no sink
    cross_attention   "image": the 257 CLIP tokens' K/V per layer
    model-owned state per session: the streaming-decode cache (in vae_dtype), the action
                      modules' kept K/V (window - block frames; counted in float32, an
                      upper bound for a bfloat16 run) and the image latents (float32)
"""

from __future__ import annotations

import ardiff
from ardiff.dtypes import DTYPE_BYTES
from ardiff.pipelines.causal_wan.decode import decode_cache_bytes
from ardiff.pipelines.matrix_game.conditioning import MAX_ENCODED_FRAMES
from ardiff.pipelines.matrix_game.config import (
    FRAMES_PER_BLOCK,
    IMAGE_TOKENS,
    MatrixGameConfig,
)

IMAGE_CACHE = "image"
BRANCH = "main"
ROPE_FRAMES = 1024  # rows of Wan's rotary time table
FLOAT32_BYTES = 4


def action_state_bytes(c: MatrixGameConfig) -> int:
    """The action modules' kept K/V of one session (float32)."""
    a = c.model.action
    kept = c.window_frames - FRAMES_PER_BLOCK
    per_layer = 2 * kept * a["keyboard_hidden_dim"]
    if a.get("enable_mouse", True):
        per_layer += 2 * kept * c.tokens_per_frame * a["mouse_hidden_dim"]
    return len(a.get("blocks", [])) * per_layer * FLOAT32_BYTES


def image_latent_bytes(c: MatrixGameConfig) -> int:
    return (MAX_ENCODED_FRAMES * c.vae.z_dim * c.latent_height * c.latent_width
            * FLOAT32_BYTES)


def build_spec(c: MatrixGameConfig) -> ardiff.ARDiffusionKVCacheSpec:
    m = c.model
    return ardiff.ARDiffusionKVCacheSpec(
        num_layers=m.num_layers, num_kv_heads=m.num_heads, head_size=m.head_size,
        tokens_per_frame=c.tokens_per_frame, frames_per_block=FRAMES_PER_BLOCK,
        window_frames=c.window_frames, sink_frames=0, session_capacity=c.session_capacity,
        max_model_len=ROPE_FRAMES, kv_branches=(ardiff.ARDiffusionKVBranchSpec(BRANCH, 0),),
        cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec(IMAGE_CACHE, IMAGE_TOKENS),),
        model_owned_state_bytes_per_session=decode_cache_bytes(
            c.vae, c.latent_height, c.latent_width, DTYPE_BYTES[c.vae_dtype])
        + action_state_bytes(c) + image_latent_bytes(c))

"""Streaming VAE decode: block by block equals one whole decode; the cache size formula."""

from __future__ import annotations

import torch
from extras import require_extra

from ardiff.pipelines.causal_wan.config import VaeShape
from ardiff.pipelines.causal_wan.decode import cache_nbytes, decode_cache_bytes
from ardiff.pipelines.causal_wan.recache import kept_latents_bytes

WAN_VAE_SHAPE = VaeShape(z_dim=16, base_dim=96, dim_mult=(1, 2, 4, 4), num_res_blocks=2,
                         temporal_downsample=(False, True, True))
WAN_480P_CACHE_BYTES = 1_888_573_440  # 1.76 GiB in bfloat16 (measured below on the real graph)


def test_streaming_decode_equals_a_whole_decode_exactly(tiny_pipeline):
    decoder = tiny_pipeline.decoder
    latents = torch.randn((1, 16, 6, 6, 8), generator=torch.Generator().manual_seed(1))
    first = decoder.decode_pixels("decode-test", latents[:, :, :3])
    second = decoder.decode_pixels("decode-test", latents[:, :, 3:])
    decoder.forget("decode-test")
    whole = decoder.vae.decode(decoder.denormalize(latents)).sample
    assert (first.shape[2], second.shape[2]) == (9, 12)  # 1 + 4 + 4, then 4 per latent frame
    assert torch.equal(torch.cat([first, second], dim=2), whole)


def test_the_cache_holds_what_the_spec_declares(tiny_pipeline, tiny_args):
    decoder = tiny_pipeline.decoder
    decoder.decode("size-test", torch.zeros((1, 16, 3, 6, 8)))
    held = cache_nbytes(decoder.caches["size-test"])
    decoder.forget("size-test")
    owned = tiny_pipeline.ar_diffusion_kv_cache_spec().model_owned_state_bytes_per_session
    assert held == owned - kept_latents_bytes(tiny_pipeline.config)  # the rest: recache.py
    assert "size-test" not in decoder.caches


def test_the_wan_vae_cache_at_480p_is_1_76_gib():
    assert decode_cache_bytes(WAN_VAE_SHAPE, 60, 104, 2) == WAN_480P_CACHE_BYTES


def test_the_formula_matches_the_real_wan_decoder_graph():
    """The real Wan2.1 VAE decoder, run on the meta device (shapes only, no compute)."""
    require_extra("wan")
    from diffusers import AutoencoderKLWan
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    from ardiff.pipelines.causal_wan.make_tiny import WAN_VAE

    with torch.device("meta"):
        vae = AutoencoderKLWan(**WAN_VAE)
    cache = [None] * sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules())
    z = torch.empty((1, 16, 1, 60, 104), device="meta", dtype=torch.bfloat16)
    vae = vae.to(torch.bfloat16)
    for first in (True, False, False):
        vae.decoder(z, feat_cache=cache, feat_idx=[0], first_chunk=first)
    assert cache_nbytes(cache) == WAN_480P_CACHE_BYTES

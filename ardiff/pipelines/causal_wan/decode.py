"""Streaming VAE decode: each session's latent frames decoded as they come, one at a time.

Wan's VAE decoder is causal in time: each causal conv keeps the last `CACHE_T` (2) frames of
its input in a feature cache. Each session keeps its own cache across blocks, so decoding
block by block gives exactly the frames of one decode of the whole video: 1 video frame from
a session's first latent frame, `temporal_factor` (4) from every later one.

    per session:  conv_in (z_dim, 1x) | mid block: 4 convs (dims[0], 1x) | up block i at 2^i x:
                  resnet convs + a 3D upsample's time conv | conv_out (dims[-1], full size)

`decode_cache_bytes` sums that from the config: the pipeline's model-owned state per session.
A batch of sessions decodes together (`decode_rows`): rows whose caches have the same layout
(the sessions at their first block; those past it) run the decoder once, their caches
stacked along the batch for the call and split back to each session after it.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch

from ardiff.pipelines.causal_wan.config import VaeShape

CACHE_T = 2  # frames each causal conv keeps (diffusers' autoencoder_kl_wan.CACHE_T)


def _stage_channels(vae: VaeShape) -> list[list[int]]:
    """Input channels of every cached conv, per resolution stage (stage i is 2^i x)."""
    dims = [vae.base_dim * u for u in (vae.dim_mult[-1], *vae.dim_mult[::-1])]
    upsample_time = vae.temporal_downsample[::-1]
    stages = [[vae.z_dim] + [dims[0]] * 4]  # conv_in, then the mid block's two resnets
    for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
        in_dim = in_dim // 2 if i > 0 else in_dim  # a 2D/3D upsample halves the channels
        resnets = [in_dim] + [out_dim] * (2 * (vae.num_res_blocks + 1) - 1)
        is_last = i == len(vae.dim_mult) - 1
        time_conv = [out_dim] if not is_last and upsample_time[i] else []
        if i == 0:
            stages[0] += resnets + time_conv
        else:
            stages.append(resnets + time_conv)
    stages[-1].append(dims[-1])  # conv_out
    return stages


def decode_cache_elements(vae: VaeShape, latent_height: int, latent_width: int) -> int:
    """Elements of one session's warm decoder feature cache at this latent size."""
    area = latent_height * latent_width
    return CACHE_T * sum(sum(channels) * area * 4 ** stage
                         for stage, channels in enumerate(_stage_channels(vae)))


def decode_cache_bytes(vae: VaeShape, latent_height: int, latent_width: int,
                       dtype_bytes: int) -> int:
    return decode_cache_elements(vae, latent_height, latent_width) * dtype_bytes


def cache_nbytes(feature_cache: list[Any]) -> int:
    """Bytes held by a feature cache (its tensors; diffusers also stores markers there)."""
    return sum(t.numel() * t.element_size() for t in feature_cache if isinstance(t, torch.Tensor))


def to_uint8(video: torch.Tensor) -> torch.Tensor:
    """[1, 3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8."""
    pixels = ((video[0].float().clamp(-1, 1) + 1) * 127.5).round()  # [3, F, H, W]
    return pixels.to(torch.uint8).permute(1, 2, 3, 0).contiguous()


class StreamingDecoder:
    """`AutoencoderKLWan`'s decoder with one feature cache per session (model-owned state).

    `decode(session_id, latents)` de-normalises the model's latents with the VAE
    config's mean / std and returns that block's video frames; `forget(session_id)`
    drops the session's cache (reset, close)."""

    def __init__(self, vae: Any) -> None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

        self.vae = vae
        self.num_convs = sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules())
        param = next(vae.parameters())
        self.device, self.dtype = param.device, param.dtype
        shape = (1, -1, 1, 1, 1)
        self.mean = torch.tensor(vae.config.latents_mean).view(shape).to(self.device, self.dtype)
        self.std = torch.tensor(vae.config.latents_std).view(shape).to(self.device, self.dtype)
        self.caches: dict[str, list[Any]] = {}

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """Model latents [1, z, F, h, w] -> the VAE's latent space (`z * std + mean`)."""
        return latents.to(self.device, self.dtype) * self.std + self.mean

    @torch.inference_mode()
    def decode_pixels(self, session_id: str, latents: torch.Tensor) -> torch.Tensor:
        """Video [1, 3, F', H, W] in [-1, 1] of one block's latents [1, z, F, h, w]."""
        is_first = session_id not in self.caches
        cache = self.caches.setdefault(session_id, [None] * self.num_convs)
        z = self.vae.post_quant_conv(self.denormalize(latents))
        frames = []
        for i in range(z.shape[2]):
            frames.append(self.vae.decoder(z[:, :, i:i + 1], feat_cache=cache, feat_idx=[0],
                                           first_chunk=is_first and i == 0))
        return torch.cat(frames, dim=2).clamp(-1, 1)

    def decode(self, session_id: str, latents: torch.Tensor) -> torch.Tensor:
        """Video frames [F', H, W, 3] uint8 of one block's latents [1, z, F, h, w]."""
        return to_uint8(self.decode_pixels(session_id, latents))

    def decode_rows(self, session_ids: Sequence[str], latents: torch.Tensor) -> list[torch.Tensor]:
        """Row i's video frames [F', H, W, 3] uint8 of latents [B, z, F, h, w], continuing
        session_ids[i]'s stream. Rows whose caches share a layout decode in one call (a
        batched convolution may round differently from one row's: within a level of uint8);
        a row alone in its layout decodes exactly as `decode`."""
        groups: dict[Hashable, list[int]] = {}
        for row, session_id in enumerate(session_ids):
            groups.setdefault(self._layout(session_id), []).append(row)
        frames: list[torch.Tensor] = [latents] * len(session_ids)  # every entry replaced below
        for rows in groups.values():
            pixels = self._decode_group([session_ids[row] for row in rows],
                                        latents[rows[0]:rows[0] + 1] if len(rows) == 1
                                        else latents[rows])
            for position, row in enumerate(rows):
                frames[row] = to_uint8(pixels[position:position + 1])
        return frames

    def _layout(self, session_id: str) -> Hashable:
        """What rows must share to decode together: None at a session's first block, else
        each cache entry's kind and shape."""
        cache = self.caches.get(session_id)
        if cache is None:
            return None
        return tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in cache)

    @torch.inference_mode()
    def _decode_group(self, session_ids: list[str], latents: torch.Tensor) -> torch.Tensor:
        """`decode_pixels` of several sessions of one cache layout in one decoder call."""
        if len(session_ids) == 1:
            return self.decode_pixels(session_ids[0], latents)
        is_first = session_ids[0] not in self.caches
        caches = [self.caches.get(sid) or [None] * self.num_convs for sid in session_ids]
        stacked = [torch.cat(entries) if isinstance(entries[0], torch.Tensor) else entries[0]
                   for entries in zip(*caches)]
        z = self.vae.post_quant_conv(self.denormalize(latents))
        frames = []
        for i in range(z.shape[2]):
            frames.append(self.vae.decoder(z[:, :, i:i + 1], feat_cache=stacked, feat_idx=[0],
                                           first_chunk=is_first and i == 0))
        for row, session_id in enumerate(session_ids):  # each session its own copy again
            self.caches[session_id] = [t[row:row + 1].clone() if isinstance(t, torch.Tensor)
                                       else t for t in stacked]
        return torch.cat(frames, dim=2).clamp(-1, 1)

    def forget(self, session_id: str) -> None:
        self.caches.pop(session_id, None)

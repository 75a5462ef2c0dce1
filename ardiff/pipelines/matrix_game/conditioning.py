"""What a session's first image gives the model, as the released inference scripts make it.

    RGB image -> centre crop to the video's aspect (`_resizecrop`) -> bilinear resize to
      H x W (torchvision's Resize on a PIL image: Pillow's) -> [-1, 1]      pixels [1, 3, 1, H, W]
    pixels -> CLIP vision tower -> tokens [1, 257, 1280]   (the "image" cross-attention)
    [pixels, zero frames ...] -> VAE encoder, in chunks (1 frame, then 4 at a time), the
      causal cache carried -> normalised means -> image latents [1, 16, n, h, w]
    model input per latent frame j: [noisy latents (16) | mask (4: ones at j = 0) | image
      latents of frame j (16)]

The released scripts encode the image followed by 4 (N - 1) black frames for a video of N
latent frames. The encoder is causal and its input constant after the image, so after a
few latent frames its output repeats exactly; `encode_image_latents` encodes until one
frame equals the one before (at most `MAX_ENCODED_FRAMES`) and every later frame is that one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ardiff.pipelines.matrix_game.config import MASK_CHANNELS

MAX_ENCODED_FRAMES = 64  # latent frames encoded at most (Wan2.1's encoder repeats after ~30)


def resize_crop(image: Any, height: int, width: int) -> Any:
    """The released `_resizecrop`: the largest centred crop of the video's aspect ratio."""
    w, h = image.size
    if h / w > height / width:
        new_w, new_h = int(w), int(int(w) * height / width)
    else:
        new_h, new_w = int(h), int(int(h) * width / height)
    left, top = (w - new_w) / 2, (h - new_h) / 2
    return image.crop((left, top, (w + new_w) / 2, (h + new_h) / 2))


def image_pixels(image: Any, height: int, width: int) -> torch.Tensor:
    """An RGB PIL image as the released frame_process makes it: [1, 3, 1, H, W] in [-1, 1]."""
    from PIL import Image

    resized = resize_crop(image, height, width).resize((width, height), Image.BILINEAR)
    pixels = torch.from_numpy(np.array(resized, dtype=np.uint8, copy=True))
    pixels = pixels.permute(2, 0, 1).contiguous().float().div(255)
    return pixels.sub(0.5).div(0.5)[None, :, None]


@dataclass
class ImageCondition:
    """One session's image conditioning: its CLIP tokens and its encoded image latents
    (frame j of the video: `latents[min(j, n - 1)]`)."""

    clip_tokens: torch.Tensor  # [1, 257, clip_dim]
    latents: torch.Tensor  # [1, 16, n, h, w], float32

    def block(self, start: int, frames: int) -> torch.Tensor:
        """[1, 20, frames, h, w]: the mask and the image latents of frames start..."""
        last = self.latents.shape[2] - 1
        index = torch.tensor([min(j, last) for j in range(start, start + frames)])
        image = self.latents.index_select(2, index)
        mask = torch.zeros_like(image[:, :MASK_CHANNELS])
        if start == 0:
            mask[:, :, 0] = 1
        return torch.cat([mask, image], dim=1)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.clip_tokens, self.latents))


def encode_image_latents(vae: Any, pixels: torch.Tensor) -> torch.Tensor:
    """The normalised VAE means [1, z, n, h, w] (float32) of the image followed by black
    frames, until a latent frame repeats the one before (see the module's docstring)."""
    param = next(vae.parameters())
    cache: list[Any] = [None] * sum(1 for m in vae.encoder.modules() if _is_causal_conv(m))
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    chunk = pixels.to(param.device, param.dtype)
    frames: list[torch.Tensor] = []
    while len(frames) < MAX_ENCODED_FRAMES:
        out = vae.quant_conv(vae.encoder(chunk, feat_cache=cache, feat_idx=[0]))
        mu = out[:, : vae.config.z_dim].float().cpu()
        frames.append((mu - mean) * (1.0 / std))
        if len(frames) > 1 and torch.equal(frames[-1], frames[-2]):
            frames.pop()
            break
        chunk = torch.zeros_like(chunk[:, :, :1]).expand(-1, -1, 4, -1, -1).contiguous()
    return torch.cat(frames, dim=2)


def _is_causal_conv(module: Any) -> bool:
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    return isinstance(module, WanCausalConv3d)

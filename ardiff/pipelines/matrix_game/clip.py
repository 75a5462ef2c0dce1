"""The CLIP image tokens Matrix-Game cross-attends to: Wan2.1's open-clip ViT-H/14 vision tower.

    image [1, 3, H, W] in [-1, 1] -> bicubic to 224 x 224 -> [0, 1] -> CLIP's mean / std
      -> patches (14 x 14, no bias) + class token + positions -> LayerNorm (pre_norm)
      -> all transformer blocks but the last (`use_31_block`) -> tokens [1, 257, 1280]

Read from `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`, its `visual.*` tensors
only (the text tower is never used), under their own names; the sizes come from the
tensors' shapes, the head count is ViT-H's (16; `heads`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ardiff.errors import PipelineLoadError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
VIT_H_HEADS = 16
PREFIX = "visual."


class LayerNorm(nn.LayerNorm):
    """open-clip's LayerNorm in Wan: computed in float32, returned in the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(),
                            self.bias.float(), self.eps).type_as(x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = LayerNorm(dim), LayerNorm(dim)
        self.attn = nn.Module()
        self.attn.to_qkv = nn.Linear(dim, 3 * dim)
        self.attn.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn.to_qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2))  # [B, heads, L, hs]
        x = x + self.attn.proj(out.transpose(1, 2).flatten(2))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    """The vision transformer, sized from its state dict."""

    def __init__(self, dim: int, patch: int, num_patches: int, layers: int,
                 heads: int = VIT_H_HEADS) -> None:
        super().__init__()
        self.image_size = int(num_patches ** 0.5) * patch
        self.patch_embedding = nn.Conv2d(3, dim, patch, stride=patch, bias=False)
        self.cls_embedding = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.pre_norm = LayerNorm(dim)
        self.transformer = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.post_norm = LayerNorm(dim)  # in the file; the tokens are taken before it

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], path: Path) -> VisionTower:
        visual = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
        try:
            dim, _, patch, _ = visual["patch_embedding.weight"].shape
            num_patches = visual["pos_embedding"].shape[1] - 1
            layers = 1 + max(int(k.split(".")[1]) for k in visual if k.startswith("transformer."))
        except (KeyError, ValueError) as exc:
            raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} holds no CLIP "
                                    f"vision tower ({type(exc).__name__}: {exc}); is it Wan2.1's "
                                    f"open-clip ViT-H/14 .pth?") from None
        tower = cls(dim, patch, num_patches, layers)
        visual.pop("head", None)  # the projection head: not used for the tokens
        missing, unexpected = tower.load_state_dict(visual, strict=False)
        if missing or unexpected:
            raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r}: CLIP keys "
                                    f"missing {sorted(missing)[:3]} unexpected "
                                    f"{sorted(unexpected)[:3]}")
        return tower

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Image tokens [B, 1 + patches, dim] of images [B, 3, H, W] in [-1, 1]."""
        size = (self.image_size, self.image_size)
        x = F.interpolate(image, size=size, mode="bicubic", align_corners=False)
        x = x.mul(0.5).add(0.5)
        mean = torch.tensor(CLIP_MEAN, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        x = (x - mean) / std
        x = self.patch_embedding(x.to(self.pos_embedding.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_embedding.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pre_norm(x + self.pos_embedding)
        return self.transformer[:-1](x)

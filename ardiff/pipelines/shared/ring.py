"""A K/V window kept the way research repos keep it: one contiguous ring per layer, no pages.

The hand-written reference loops (`bouncing/reference.py`, `tiny_dit/reference.py`) attend
through it; `ardiff bench` times them against ardiff. A ring keeps the sink frames and the
`recent` = window_frames - frames_per_block frames a block sees besides itself, each
recent frame written twice, at slot s and s + recent, so the last m frames are always one
contiguous slice, oldest first (the order ardiff gives them):

    slots     | sink | 0 | 1 | 2 | 3 | 0'| 1'| 2'| 3'|     recent = 4, frames 0..6 committed
    frames    |  0   | 5 | 6 | 3 | 4 | 5 | 6 | 3 | 4 |     (sink = 1)
    visible   [  0   ]        [ 3   4   5   6 ]            = sink + ring[2:6]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVRing:
    """One layer's K or V history: [sink frames | 2 x recent frames] tokens, preallocated."""

    def __init__(self, tokens_per_frame: int, sink_frames: int, recent_frames: int,
                 heads: int, head_size: int, device, dtype: torch.dtype) -> None:
        self.tokens, self.sink, self.recent = tokens_per_frame, sink_frames, recent_frames
        shape = ((sink_frames + 2 * recent_frames) * tokens_per_frame, heads, head_size)
        self.data = torch.empty(shape, device=device, dtype=dtype)

    def write(self, start_frame: int, x: torch.Tensor) -> None:
        """The frames from `start_frame` on: x [frames * tokens, heads, head_size]."""
        for i, frame_x in enumerate(x.split(self.tokens)):
            frame = start_frame + i
            if frame < self.sink:
                self._slot(frame).copy_(frame_x)
            elif self.recent:
                slot = self.sink + (frame - self.sink) % self.recent
                self._slot(slot).copy_(frame_x)
                self._slot(slot + self.recent).copy_(frame_x)

    def visible(self, frames: int) -> list[torch.Tensor]:
        """What a block starting at frame `frames` sees of the history: [sink, recent] views."""
        sink = min(self.sink, frames)
        recent = min(self.recent, frames - sink)
        start = self.sink + (frames - recent - self.sink) % self.recent if recent else 0
        t = self.tokens
        return [self.data[:sink * t], self.data[start * t:(start + recent) * t]]

    def _slot(self, slot: int) -> torch.Tensor:
        return self.data[slot * self.tokens:(slot + 1) * self.tokens]


class RingCache:
    """K and V rings for every layer of one stream (one session, one branch)."""

    def __init__(self, num_layers: int, tokens_per_frame: int, sink_frames: int,
                 recent_frames: int, kv_heads: int, head_size: int, device,
                 dtype: torch.dtype) -> None:
        def ring() -> KVRing:
            return KVRing(tokens_per_frame, sink_frames, recent_frames, kv_heads, head_size,
                          device, dtype)

        self.k = [ring() for _ in range(num_layers)]
        self.v = [ring() for _ in range(num_layers)]

    def block(self, start_frame: int, commit: bool) -> RingBlock:
        return RingBlock(self, start_frame, commit)


class RingBlock:
    """What a model's forward needs of a KV block: its first frame and `attend`."""

    def __init__(self, cache: RingCache, start_frame: int, commit: bool) -> None:
        self.cache, self.start_frame, self.commit = cache, start_frame, commit

    def attend(self, layer: int, q, k, v, extra_k=None, extra_v=None, scale=None):
        """q [q_tokens, heads, hs] to [visible history | k | extra]; k, v become history on a
        commit. Returns [q_tokens, heads, hs]."""
        k_ring, v_ring = self.cache.k[layer], self.cache.v[layer]
        extra = extra_k is not None
        keys = torch.cat([*k_ring.visible(self.start_frame), k, *([extra_k] if extra else [])])
        values = torch.cat([*v_ring.visible(self.start_frame), v, *([extra_v] if extra else [])])
        q4, k4, v4 = (x.transpose(0, 1)[None] for x in (q, keys, values))
        out = F.scaled_dot_product_attention(q4, k4, v4, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        if self.commit:
            k_ring.write(self.start_frame, k)
            v_ring.write(self.start_frame, v)
        return out[0].transpose(0, 1)  # [1, heads, tokens, hs] -> [tokens, heads, hs]

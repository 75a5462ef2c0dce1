"""An attention-only pipeline for benchmarks: any KV geometry, no weights.

Each block draws seeded random q/k/v (`[tokens, heads, head_size]`), runs
`num_steps` probes and one commit through `blk.attend` on every layer, and
turns the attention output into a small uint8 image per frame, so paged and
dense runs can be compared frame by frame. With a Wan-sized geometry nearly
all of its time is attention and K/V movement: what the KV runtime costs.

`request.extra["q_tokens"]` shortens the queries (e.g. to fill a window
quickly before timing); by default every token of the block queries.
"""

from __future__ import annotations

import torch

import ardiff
from ardiff.pipelines.shared.sampling import block_generator

IMAGE_SIDE = 8  # pixels per side of the per-frame summary image


class SyntheticAttention(ardiff.ARDiffusionPipelineBase):
    """Declares the geometry it is given; all its compute is KV attention."""

    def __init__(self, num_layers: int = 2, num_kv_heads: int = 2, head_size: int = 16,
                 tokens_per_frame: int = 16, frames_per_block: int = 3, window_frames: int = 9,
                 sink_frames: int = 0, num_steps: int = 1, session_capacity: int = 2) -> None:
        self.spec = ardiff.ARDiffusionKVCacheSpec(
            num_layers=num_layers, num_kv_heads=num_kv_heads, head_size=head_size,
            tokens_per_frame=tokens_per_frame, frames_per_block=frames_per_block,
            window_frames=window_frames, sink_frames=sink_frames,
            session_capacity=session_capacity,
            kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))
        self.num_steps = num_steps
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return self.spec

    def load(self, device, dtype) -> None:
        self.device, self.dtype = torch.device(device), dtype

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """One block with one query token: this pipeline has no model to warm, and `bench`
        fills the window itself before it times anything."""
        return [ardiff.RolloutRequest(session_id, block_index=0, extra={"q_tokens": 1})]

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        s = self.spec
        tokens = s.frames_per_block * s.tokens_per_frame
        q_tokens = int(request.extra.get("q_tokens", tokens))
        start = state.num_committed_frames("main")
        generator = block_generator(request.seed, start)
        draw = lambda n: torch.randn(n, s.num_kv_heads, s.head_size,  # noqa: E731
                                     generator=generator).to(self.device, self.dtype)
        q, k, v = draw(q_tokens), draw(tokens), draw(tokens)
        out = None
        for step in range(self.num_steps + 1):  # num_steps probes, then the commit
            with state.block("main", commit=step == self.num_steps) as blk:
                for layer in range(s.num_layers):
                    out = blk.attend(layer, q, k, v)
        return ardiff.BlockOutput(frames=self._frames(out))

    def _frames(self, out: torch.Tensor) -> torch.Tensor:
        """[q_tokens, heads, head_size] -> one IMAGE_SIDE^2 RGB image per frame of the block."""
        num_frames = self.spec.frames_per_block
        values = out.float().mean(dim=(1, 2))  # [q_tokens]
        cells = IMAGE_SIDE * IMAGE_SIDE * 3
        picked = values[torch.arange(num_frames * cells, device=values.device) % values.numel()]
        pixels = (picked * 400 + 128).clamp(0, 255).round().to(torch.uint8)
        return pixels.reshape(num_frames, IMAGE_SIDE, IMAGE_SIDE, 3).cpu()

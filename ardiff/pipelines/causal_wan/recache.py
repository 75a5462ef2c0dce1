"""LongLive v1.0's prompt switch with KV recache (its interactive inference, `global_sink: true`).

At a switch before the block at latent frame T, LongLive re-runs its last min(L, T) clean
latent frames (L = local_attn_size = sink S + window W) in one forward at t = 0 under the
new prompt, at their own positions, with no mask among them. With T > L its write starts
after the sink (`write_start_index = max(local_start_index, sink_tokens)`): the sink keeps
its old-prompt K/V, and the first S re-run frames are inert (their K/V are neither written
nor read). So, per branch, `recache_branch` re-runs

    T <= S + W:  frames 0 .. T-1     they see each other; every kept one (sink too) rewritten
    T >  S + W:  frames T-W .. T-1   they see the old sink and each other; the kept ones
                                     rewritten, the first B (evicted) are context only
    sink 3, window 9, blocks of 3, T = 15:    0 1 2 | 6 7 8 | 9 .. 14
                                              old     context  rewritten

`KeptLatents` holds the clean latents a recache may re-run (float32, at most S + W frames:
`kept_latents_bytes`, model-owned state in the spec).
"""

from __future__ import annotations

from typing import Any

import torch

from ardiff.errors import KVStateError
from ardiff.pipelines.causal_wan.config import CausalWanConfig

RECACHE = "recache"  # RolloutRequest.extra key: re-run the last frames before this block
LATENT_BYTES = 4     # clean latents are kept in float32, as the sampler makes them


def recache_range(num_committed: int, sink_frames: int, window_frames: int) -> tuple[int, int]:
    """(first frame, frame count) a switch at frame `num_committed` re-runs (0 frames at 0)."""
    if num_committed <= sink_frames + window_frames:
        return 0, num_committed
    return num_committed - window_frames, window_frames


def kept_latents_bytes(c: CausalWanConfig) -> int:
    """Bytes of one session's `KeptLatents` at most: one float32 latent per frame re-run."""
    frames = c.sink_frames + c.window_frames
    return frames * c.transformer.in_channels * c.latent_height * c.latent_width * LATENT_BYTES


class KeptLatents:
    """Per session, the clean latents [1, C, 1, h, w] of the frames the next recache re-runs,
    by absolute frame index. `record` after every commit; `forget` on reset and close."""

    def __init__(self) -> None:
        self._frames: dict[str, dict[int, torch.Tensor]] = {}

    def record(self, session_id: str, start_frame: int, clean: torch.Tensor,
               sink_frames: int, window_frames: int) -> None:
        """Add a committed block's clean latents [1, C, F, h, w]; drop the frames no later
        recache re-runs (its range only moves forward)."""
        frames = self._frames.setdefault(session_id, {})
        for offset in range(clean.shape[2]):
            # a copy per frame: a view would hold the whole block, and the caller owns `clean`
            frames[start_frame + offset] = clean[:, :, offset:offset + 1].to(torch.float32,
                                                                               copy=True)
        first, count = recache_range(start_frame + clean.shape[2], sink_frames, window_frames)
        for index in [i for i in frames if not first <= i < first + count]:
            del frames[index]

    def get(self, session_id: str, start_frame: int, num_frames: int) -> torch.Tensor:
        """Latents [1, C, num_frames, h, w] of frames start_frame.. (all recorded)."""
        frames = self._frames.get(session_id, {})
        wanted = range(start_frame, start_frame + num_frames)
        missing = [i for i in wanted if i not in frames]
        if missing:
            raise KVStateError(f"causal-wan: recache of session {session_id!r} needs the clean "
                               f"latents of frames {missing}, which this pipeline did not "
                               f"make; a session's history must come from its generate_block")
        return torch.cat([frames[i] for i in wanted], dim=2)

    def nbytes(self, session_id: str) -> int:
        return sum(t.numel() * t.element_size() for t in self._frames.get(session_id, {}).values())

    def forget(self, session_id: str) -> None:
        self._frames.pop(session_id, None)


def recache_branch(transformer: Any, state: Any, branch: str, latents: KeptLatents,
                   cross: list, device: torch.device, dtype: torch.dtype) -> None:
    """LongLive's recache of `branch` at t = 0 under the text K/V `cross` (see above)."""
    spec = state.spec
    start, count = recache_range(state.num_committed_frames(branch), spec.sink_frames,
                                 spec.window_frames)
    if not any(start <= frame < start + count for frame in state.kept_frames(branch)):
        return  # nothing kept to rewrite (a fresh session)
    x = latents.get(state.session_id, start, count).to(device, dtype)
    with state.recache(branch, start, count) as blk:
        transformer.flow(x, 0.0, blk, cross)

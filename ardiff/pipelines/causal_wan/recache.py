"""LongLive's prompt switch with KV recache: the kept frames' K/V re-encoded under the new prompt.

A frame's K/V depend on its prompt (cross-attention feeds every layer), so before the block
that switches prompts, per branch, the clean latents of every kept frame (the sink's too)
run again at t = 0 under the new prompt, chronologically and block-causally:

    kept frames (sink 3, window 9, blocks of 3, 15 committed):   0 1 2 | 9 .. 14
    recache runs, <= frames_per_block each:                     [0 1 2] [9 10 11] [12 13 14]
    each run: with state.recache(branch, start, n) as blk:  flow(latents, t = 0, blk, new text)

The next block then sees only K/V made under the new prompt (LongLive's `global_sink: false`);
evicted frames cannot be re-encoded. `KeptLatents` holds the kept frames' clean latents:
model-owned state, float32, `kept_latents_bytes` per session (counted in the spec).
"""

from __future__ import annotations

from typing import Any

import torch

from ardiff.errors import KVStateError
from ardiff.kv.window import WindowPolicy
from ardiff.pipelines.causal_wan.config import CausalWanConfig

RECACHE = "recache"  # RolloutRequest.extra key: re-encode the kept frames before this block
LATENT_BYTES = 4     # clean latents are kept in float32, as the sampler makes them


def kept_latents_bytes(c: CausalWanConfig) -> int:
    """Bytes of one session's `KeptLatents` at most: one float32 latent per kept frame."""
    policy = WindowPolicy(c.sink_frames, c.window_frames, c.frames_per_block)
    kept = c.sink_frames + policy.past_frames
    return kept * c.transformer.in_channels * c.latent_height * c.latent_width * LATENT_BYTES


class KeptLatents:
    """Per session, the clean latents [1, C, 1, h, w] of the frames its cache keeps, by
    absolute frame index. `record` after every commit; `forget` on reset and close."""

    def __init__(self) -> None:
        self._frames: dict[str, dict[int, torch.Tensor]] = {}

    def record(self, session_id: str, start_frame: int, clean: torch.Tensor,
               kept_frames: list[int]) -> None:
        """Add a committed block's clean latents [1, C, F, h, w]; drop frames no longer kept."""
        frames = self._frames.setdefault(session_id, {})
        for offset in range(clean.shape[2]):
            # a copy per frame: a view would hold the whole block, and the caller owns `clean`
            frames[start_frame + offset] = clean[:, :, offset:offset + 1].to(torch.float32,
                                                                               copy=True)
        keep = set(kept_frames)
        for index in [i for i in frames if i not in keep]:
            del frames[index]

    def get(self, session_id: str, start_frame: int, num_frames: int) -> torch.Tensor:
        """Latents [1, C, num_frames, h, w] of frames start_frame.. (all kept)."""
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


def frame_runs(frames: list[int], frames_per_block: int) -> list[tuple[int, int]]:
    """(start, count) of consecutive `frames`, cut every `frames_per_block` frames."""
    runs: list[list[int]] = []
    for frame in frames:
        if runs and runs[-1][1] + runs[-1][0] == frame and runs[-1][1] < frames_per_block:
            runs[-1][1] += 1
        else:
            runs.append([frame, 1])
    return [(start, count) for start, count in runs]


def recache_branch(transformer: Any, state: Any, branch: str, latents: KeptLatents,
                   cross: list, device: torch.device, dtype: torch.dtype) -> None:
    """Re-encode every kept frame of `branch` at t = 0 under the text K/V `cross`."""
    for start, count in frame_runs(state.kept_frames(branch), state.spec.frames_per_block):
        x = latents.get(state.session_id, start, count).to(device, dtype)
        with state.recache(branch, start, count) as blk:
            transformer.flow(x, 0.0, blk, cross)

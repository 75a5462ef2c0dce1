"""Pipelines for the rollout tests: they tell a test, even in another process, what they got.

`RecordingPipeline` drives the KV state API for real (one commit block per forward, a
cross-attention cache set on first use) and appends one JSON line per rollout request (not
warmup) to `log`: session_id, block_index, prompt, actions, reset, clear_cross_kv,
start_frame (where the cache put the block) and had_cross_kv (whether the session's text K/V
survived until it). Frame f is painted grey `paint(f)`, so any video format shows positions.
`SlowPipeline` sleeps `sleep_s` per block and keeps the count of blocks made in `marker`.

Loaded as `/abs/path/rollout_pipelines.py:RecordingPipeline` from YAML.
"""

from __future__ import annotations

import json
import os
import time

import torch

import ardiff

BRANCH = "main"
TEXT_CACHE = "text"
TEXT_TOKENS = 2
GREY_STEP = 20  # grey level between consecutive frames: survives lossy codecs

# 1 layer x 1 KV head x 8 dims, 2 tokens per frame, blocks of 2 frames, a 4-frame window.
RECORDING_SPEC = dict(num_layers=1, num_kv_heads=1, head_size=8, tokens_per_frame=2,
                      frames_per_block=2, window_frames=4, sink_frames=1, session_capacity=4,
    kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))


def paint(frame: int) -> int:
    """The grey level of absolute frame `frame`."""
    return frame * GREY_STEP % 256


class RecordingPipeline(ardiff.ARDiffusionPipelineBase):
    """A real (tiny) KV-using pipeline that logs every rollout request it gets to `log`."""

    def __init__(self, log: str | None = None, frame_size: int = 16, warmup_blocks: int = 1,
                 **spec_fields) -> None:
        self.log, self.frame_size, self.warmup_blocks = log, frame_size, warmup_blocks
        self.spec = ardiff.ARDiffusionKVCacheSpec(
            **{**RECORDING_SPEC, **spec_fields},
            cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec(TEXT_CACHE, TEXT_TOKENS),))
        self.records: list[dict] = []

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return self.spec

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        return [ardiff.RolloutRequest(session_id, block_index=i, prompt="warmup")
                for i in range(self.warmup_blocks)]

    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        had_cross_kv = state.cross_kv(BRANCH, TEXT_CACHE) is not None
        if not had_cross_kv:
            state.set_cross_kv(BRANCH, TEXT_CACHE, [self._text_kv()] * self.spec.num_layers)
        with state.block(BRANCH, commit=True) as blk:
            start_frame = blk.start_frame
            tokens = blk.num_frames * self.spec.tokens_per_frame
            x = torch.zeros(tokens, self.spec.num_kv_heads, self.spec.head_size)
            for layer in range(self.spec.num_layers):
                blk.attend(layer, x, x, x)  # [tokens, heads, head_size]
        if not request.session_id.startswith("__ardiff"):  # warmup is not the rollout
            self._record(request, start_frame, had_cross_kv)
            self.after_block(request)
        return ardiff.BlockOutput(frames=self._frames(start_frame))

    def after_block(self, request: ardiff.RolloutRequest) -> None:
        """Variants act here, after a rollout block is made (before its frames are written)."""

    def _text_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (TEXT_TOKENS, self.spec.num_kv_heads, self.spec.head_size)
        return torch.ones(shape), torch.ones(shape)

    def _record(self, request: ardiff.RolloutRequest, start_frame: int, had_cross_kv: bool):
        record = {"session_id": request.session_id, "block_index": request.block_index,
                  "prompt": request.prompt,
                  "actions": None if request.actions is None else list(request.actions),
                  "reset": request.reset, "clear_cross_kv": request.clear_cross_kv,
                  "start_frame": start_frame, "had_cross_kv": had_cross_kv}
        self.records.append(record)
        if self.log:
            with open(self.log, "a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")

    def _frames(self, start_frame: int) -> torch.Tensor:
        """[F, H, W, 3] uint8, frame f painted grey paint(f)."""
        f, size = self.spec.frames_per_block, self.frame_size
        levels = torch.tensor([paint(start_frame + i) for i in range(f)], dtype=torch.uint8)
        return levels[:, None, None, None].expand(f, size, size, 3).contiguous()


class SlowPipeline(RecordingPipeline):
    """Takes `sleep_s` per rollout block; `marker` holds the number of blocks made so far."""

    def __init__(self, marker: str, sleep_s: float = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker, self.sleep_s = marker, sleep_s

    def after_block(self, request: ardiff.RolloutRequest) -> None:
        time.sleep(self.sleep_s)  # where Ctrl-C lands: inside a block
        tmp = f"{self.marker}.tmp"
        with open(tmp, "w", encoding="utf-8") as marker:
            marker.write(str(len(self.records)))
        os.replace(tmp, self.marker)  # a reader never sees a half-written number

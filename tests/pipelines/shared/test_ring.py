"""The reference loops' K/V ring (ardiff/pipelines/shared/ring.py): the sink and the last frames,
oldest first, as views of one tensor, written a frame at a time or a block at a time."""

from __future__ import annotations

import pytest
import torch

from ardiff.pipelines.shared.ring import KVRing

TOKENS, HEADS, HEAD_SIZE = 2, 1, 4


def frame_ids(views: list[torch.Tensor]) -> list[int]:
    return [int(x) for x in torch.cat(views)[::TOKENS, 0, 0]]


@pytest.mark.parametrize("sink, recent, block", [(1, 3, 1), (0, 4, 1), (1, 6, 3), (2, 0, 2)])
def test_a_block_sees_the_sink_and_the_last_recent_frames_oldest_first(sink, recent, block):
    ring = KVRing(TOKENS, sink, recent, HEADS, HEAD_SIZE, "cpu", torch.float32)
    storage = ring.data.untyped_storage().data_ptr()
    for start in range(0, 12, block):
        frames = torch.arange(start, start + block).float().repeat_interleave(TOKENS)
        ring.write(start, frames[:, None, None].expand(-1, HEADS, HEAD_SIZE))
        committed = start + block
        views = ring.visible(committed)
        kept = [f for f in range(committed) if f >= sink][-recent:] if recent else []
        assert frame_ids(views) == list(range(min(sink, committed))) + kept
        assert all(v.untyped_storage().data_ptr() == storage for v in views)  # nothing gathered

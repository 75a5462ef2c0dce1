"""RunTimeline: one value per block, thumbnails at indices fixed before the first block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ardiff.rollout.timeline import RunTimeline, current_rss_bytes, thumbnail_indices


@pytest.mark.parametrize("total, count, expected", [
    (10, 4, [0, 3, 6, 9]), (3, 8, [0, 1, 2]), (1, 8, [0]), (0, 8, []), (96, 1, [0]),
])
def test_thumbnail_indices_are_spread_with_both_ends(total, count, expected):
    assert thumbnail_indices(total, count) == expected


def event(block_frames: list[int], written: int, total: int, pages: int | None):
    frames = torch.tensor(block_frames, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 2, 2, 3)
    block = SimpleNamespace(frames=frames, latency_s=0.01 * written)
    return SimpleNamespace(phase="rollout", block=block, frames_written=written,
                           frames_total=total, pages_in_use=pages)


def test_record_keeps_one_value_per_block_and_the_wanted_frames():
    timeline = RunTimeline(thumbnails_wanted=3)
    timeline.record(SimpleNamespace(phase="warmup", block=None, frames_total=6))
    for written, values in ((2, [0, 1]), (4, [2, 3]), (6, [4, 5])):  # frame f is grey f
        timeline.record(event(values, written, 6, pages=written // 2))
    assert timeline.blocks == 3 and timeline.pages_in_use == [1, 2, 3]
    assert timeline.latencies_s == [0.02, 0.04, 0.06]
    assert [index for index, _ in timeline.thumbnails] == [0, 2, 5]  # round(2.5) is 2
    assert [int(frame[0, 0, 0]) for _, frame in timeline.thumbnails] == [0, 2, 5]
    assert all(rss > 0 for rss in timeline.rss_bytes)


def test_current_rss_is_positive():
    assert current_rss_bytes() > 0

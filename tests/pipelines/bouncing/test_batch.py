"""The bouncing world model's batched forward (`generate_blocks`) against its one-session one.

Sessions join a batch at different blocks (ragged histories: start frames from the
simulator beside sampled frames, one session past its first eviction), one row takes
another step count, one session is reset mid-run; both arms run the same requests through
the runner (`tests/support/batch_drive.py`), on the paged cache (poisoned) and the dense
one. The bound is batch_drive's (frames within 1 level, pixels within 1e-5 relative);
today's kernels make them bit-equal, which the paged-equals-dense test holds exactly.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import ardiff
from ardiff.pipelines.bouncing import BouncingWorld, sim
from ardiff.pipelines.bouncing import pipeline as bouncing_pipeline
from ardiff.pipelines.bouncing.model import BouncingDiT
from tests.support.batch_drive import assert_rows_match, batch_runner, ragged_schedule, run

STARTS = [0, 2, 4, 1, 3, 0, 4, 2]   # the batch at which session i joins
NUM_BATCHES = 6
RESET_AT = 4   # s0's block 4 resets it (past its first eviction: frame 3 no longer sees 1)
SMALL = dict(upscale=1, context_frames=2, window_frames=3, num_steps=1, session_capacity=8)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pipelines():
    made: dict[int, BouncingWorld] = {}

    def get(sink_frames: int) -> BouncingWorld:
        if sink_frames not in made:
            made[sink_frames] = BouncingWorld(sink_frames=sink_frames, **SMALL)
            made[sink_frames].load("cpu", torch.float32)
        return made[sink_frames]

    return get


class PixelTap:
    """The clean frames [1, 3, 32, 32] the pipeline turns into video, one per session."""

    def __init__(self, monkeypatch) -> None:
        self.rows: list[torch.Tensor] = []
        to_video = bouncing_pipeline.to_video

        def tapped(x: torch.Tensor, upscale: int) -> torch.Tensor:
            self.rows.extend(row[None].clone() for row in x)  # one frame per block
            return to_video(x, upscale)

        monkeypatch.setattr(bouncing_pipeline, "to_video", tapped)

    def take(self) -> list[torch.Tensor]:
        rows, self.rows = self.rows, []
        return rows


def request(i: int, k: int) -> ardiff.RolloutRequest:
    """Session i's block k: its own seed and actions; s1 takes 2 steps at block 3."""
    return ardiff.RolloutRequest(f"s{i}", block_index=k, seed=100 + i,
                                 actions=(sim.ACTIONS[(i + k) % len(sim.ACTIONS)],),
                                 num_steps=2 if (i, k) == (1, 3) else None,
                                 reset=(i, k) == (0, RESET_AT))


def both_arms(pipeline, backend: str, rows: int, tap: PixelTap):
    schedule = ragged_schedule(STARTS[:rows], NUM_BATCHES, request)
    assert max(len(batch) for batch in schedule) == rows
    batched = run(batch_runner(pipeline, backend, rows), schedule, batched=True, tap=tap)
    single = run(batch_runner(pipeline, backend, rows), schedule, batched=False, tap=tap)
    return batched, single


CASES = [(8, "paged", 1)]           # the rest (B = 1, 2, 3, 8; both backends; sink or not): heavy
ALL_CASES = [case for case in itertools.product((1, 2, 3, 8), ("paged", "dense"), (0, 1))
             if case not in CASES]


def check_batched_equals_single(pipelines, monkeypatch, rows, backend, sink_frames):
    tap = PixelTap(monkeypatch)
    batched, single = both_arms(pipelines(sink_frames), backend, rows, tap)
    assert len(single.frames["s0"]) == NUM_BATCHES
    assert len(single.latents["s0"]) == NUM_BATCHES
    assert_rows_match(batched, single)


@pytest.mark.parametrize("rows, backend, sink_frames", CASES)
def test_batched_frames_equal_one_session_frames(pipelines, monkeypatch, rows, backend,
                                                 sink_frames):
    check_batched_equals_single(pipelines, monkeypatch, rows, backend, sink_frames)


@pytest.mark.heavy
@pytest.mark.parametrize("rows, backend, sink_frames", ALL_CASES)
def test_batched_frames_equal_one_session_frames_everywhere(pipelines, monkeypatch, rows,
                                                            backend, sink_frames):
    check_batched_equals_single(pipelines, monkeypatch, rows, backend, sink_frames)


def test_batched_paged_equals_batched_dense_exactly(pipelines):
    schedule = ragged_schedule(STARTS[:3], NUM_BATCHES, request)
    paged, dense = (run(batch_runner(pipelines(0), backend, 3), schedule, batched=True)
                    for backend in ("paged", "dense"))
    assert_rows_match(paged, dense, exact=True)


def test_a_batch_is_one_forward_per_step(pipelines, monkeypatch):
    """Four sessions in step: each batch is one forward of 4 rows per step (start frames:
    the commit alone; sampled frames: num_steps probes and the commit)."""
    rows_seen: list[int] = []
    forward_blocks = BouncingDiT.forward_blocks

    def counted(self, x, *args):
        rows_seen.append(x.shape[0])
        return forward_blocks(self, x, *args)

    monkeypatch.setattr(BouncingDiT, "forward_blocks", counted)
    pipeline = pipelines(0)
    schedule = ragged_schedule([0] * 4, 3, request)   # 2 start frames, then 1 sampled
    run(batch_runner(pipeline, "paged", 4), schedule, batched=True)
    assert rows_seen == [4] * (2 + pipeline.config.num_steps + 1)

"""The tiny DiT's batched forward (`generate_blocks`) against its one-session one, CFG on
and off.

Sessions join at different blocks (ragged, one past its first eviction), on different
prompts and seeds; one switches prompt, one takes another step count, one turns guidance on
late (its negative branch then holds fewer frames than its positive one), guidance scales
differ by row (unguided rows beside guided ones in a CFG batch), and one session is reset
mid-run. Both arms run the same requests through the runner (`tests/support/batch_drive.py`)
on the paged cache (poisoned) and the dense one, within batch_drive's bound (frames within
1 level, latents within 1e-5 relative); paged equals dense exactly.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

import pytest
import torch
from numerics import FRAME_LEVELS, assert_floats_close

import ardiff
from ardiff.pipelines.tiny_dit import TinyCausalDiT
from ardiff.pipelines.tiny_dit.decoder import LatentDecoder
from ardiff.pipelines.tiny_dit.model import TinyDiT
from tests.support.batch_drive import assert_rows_match, batch_runner, ragged_schedule, run

SMALL = dict(latent_size=8, dim=32, num_heads=4, num_kv_heads=2, frames_per_block=2,
             window_frames=4, upscale=2, num_steps=2, session_capacity=8)
STARTS = [0, 2, 1, 3, 0, 2, 1, 3]   # the batch at which session i joins
NUM_BATCHES = 5
RESET_AT = 3                        # s0's block 3 resets it (after its first eviction)
PROMPTS = ["a red ball", "a blue cube", "waves"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pipelines():
    made: dict[tuple[bool, int], TinyCausalDiT] = {}

    def get(cfg: bool, sink_frames: int) -> TinyCausalDiT:
        if (cfg, sink_frames) not in made:
            made[cfg, sink_frames] = TinyCausalDiT(cfg=cfg, sink_frames=sink_frames, **SMALL)
            made[cfg, sink_frames].load("cpu", torch.float32)
        return made[cfg, sink_frames]

    return get


class LatentTap:
    """The latent blocks [F, C, h, w] the pipeline decodes, one per session, in order."""

    def __init__(self, monkeypatch) -> None:
        self.rows: list[torch.Tensor] = []
        self.calls: list[int] = []  # rows per decode
        decode_rows = LatentDecoder.decode_rows

        def tapped(decoder, latents: torch.Tensor, previous):
            self.calls.append(latents.shape[0])
            self.rows.extend(row.clone() for row in latents)
            return decode_rows(decoder, latents, previous)

        monkeypatch.setattr(LatentDecoder, "decode_rows", tapped)

    def take(self) -> list[torch.Tensor]:
        rows, self.rows = self.rows, []
        return rows


def requests_for(cfg: bool):
    def request(i: int, k: int) -> ardiff.RolloutRequest:
        """Session i's block k: s1 switches prompt at block 2 and takes 1 step at block 3;
        under CFG rows take scales 1 (unguided), 3, 2, ..., and s2 turns guidance on late."""
        guidance = 1.0
        if cfg:
            guidance = 1.0 if (i == 2 and k < 2) else (1.0, 3.0, 2.0)[i % 3] + (i == 2)
        return ardiff.RolloutRequest(
            f"s{i}", block_index=k, seed=50 + i, prompt=PROMPTS[(i + (i == 1 and k >= 2)) % 3],
            negative_prompt="blurry", guidance_scale=guidance,
            num_steps=1 if (i, k) == (1, 3) else None, reset=(i, k) == (0, RESET_AT))
    return request


CASES = [(8, "paged", True, 1), (3, "dense", False, 0)]
ALL_CASES = [case for case in itertools.product((1, 2, 3, 8), ("paged", "dense"), (False, True),
                                                (0, 1)) if case not in CASES]


def check_batched_equals_single(pipelines, monkeypatch, rows, backend, cfg, sink_frames):
    tap = LatentTap(monkeypatch)
    pipeline = pipelines(cfg, sink_frames)
    schedule = ragged_schedule(STARTS[:rows], NUM_BATCHES, requests_for(cfg))
    assert max(len(batch) for batch in schedule) == rows
    batched = run(batch_runner(pipeline, backend, rows), schedule, batched=True, tap=tap)
    single = run(batch_runner(pipeline, backend, rows), schedule, batched=False, tap=tap)
    assert len(single.latents["s0"]) == NUM_BATCHES
    assert_rows_match(batched, single)


@pytest.mark.parametrize("rows, backend, cfg, sink_frames", CASES)
def test_batched_frames_equal_one_session_frames(pipelines, monkeypatch, rows, backend, cfg,
                                                 sink_frames):
    check_batched_equals_single(pipelines, monkeypatch, rows, backend, cfg, sink_frames)


@pytest.mark.heavy
@pytest.mark.parametrize("rows, backend, cfg, sink_frames", ALL_CASES)
def test_batched_frames_equal_one_session_frames_everywhere(pipelines, monkeypatch, rows,
                                                            backend, cfg, sink_frames):
    check_batched_equals_single(pipelines, monkeypatch, rows, backend, cfg, sink_frames)


def test_batched_paged_equals_batched_dense_exactly(pipelines, monkeypatch):
    tap = LatentTap(monkeypatch)
    schedule = ragged_schedule(STARTS[:3], NUM_BATCHES, requests_for(True))
    paged, dense = (run(batch_runner(pipelines(True, 1), backend, 3), schedule, batched=True,
                        tap=tap) for backend in ("paged", "dense"))
    assert_rows_match(paged, dense, exact=True)


def test_a_batch_is_one_forward_per_branch_and_step(pipelines, monkeypatch):
    """Three guided sessions in step: per step one probe of 3 rows on each branch, then one
    commit of 3 rows on each branch; the decoder runs once."""
    rows_seen: list[int] = []
    forward = TinyDiT.forward

    def counted(self, x, *args, **kwargs):
        rows_seen.append(x.shape[0] if x.dim() == 5 else 0)
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(TinyDiT, "forward", counted)
    tap = LatentTap(monkeypatch)
    pipeline = pipelines(True, 1)
    schedule = [[ardiff.RolloutRequest(f"s{i}", prompt=PROMPTS[i], guidance_scale=2.0 + i)
                 for i in range(3)]]
    run(batch_runner(pipeline, "paged", 3), schedule, batched=True, tap=tap)
    assert rows_seen == [3] * (2 * pipeline.config.num_steps + 2)
    assert tap.calls == [3]


# -- CFG-parallel: each rank runs one branch of the guided rows, batched ------------------
class ThreadGroup:
    """Two ranks as two threads: `all_gather` swaps their tensors (rank order)."""

    def __init__(self) -> None:
        self.slots: list[torch.Tensor | None] = [None, None]
        self.barrier = threading.Barrier(2, timeout=60)


class ThreadContext:
    """What the pipeline reads of a `ParallelContext`, over a `ThreadGroup`."""

    world_size = 2

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank

    @property
    def branch(self) -> str:
        return ("positive", "negative")[self.rank]

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.group.slots[self.rank] = tensor.clone()
        self.group.barrier.wait()
        gathered = [t for t in self.group.slots if t is not None]
        self.group.barrier.wait()  # both have read before either writes again
        return gathered


def test_cfg_parallel_batches_equal_one_process(monkeypatch):
    """Guided rows beside unguided ones, split over two ranks (threads): every rank's frames
    equal one process's, session by session. A session keeps its guidance on or off (under
    CFG-parallel its branches share one slot: a rank holds one branch per session)."""
    def request(i: int, k: int) -> ardiff.RolloutRequest:
        return dataclasses.replace(requests_for(True)(i, k),
                                   guidance_scale=(1.0, 3.0, 2.0)[i % 3])

    schedule = ragged_schedule(STARTS[:3], 4, request)
    group, outs, errors = ThreadGroup(), [None, None], []
    ranks = [TinyCausalDiT(cfg=True, sink_frames=1, **SMALL) for _ in range(2)]
    for index, pipeline in enumerate(ranks):  # loaded one by one: load seeds torch's RNG
        pipeline.bind_ar_diffusion_parallel(ThreadContext(group, index))
        pipeline.load("cpu", torch.float32)

    def rank(index: int) -> None:
        try:
            outs[index] = run(batch_runner(ranks[index], "paged", 3), schedule, batched=True)
        except BaseException as error:  # the other rank must not wait for this one
            errors.append(error)
            group.barrier.abort()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    one = TinyCausalDiT(cfg=True, sink_frames=1, **SMALL)
    one.load("cpu", torch.float32)
    single = run(batch_runner(one, "paged", 3), schedule, batched=False)
    for out in outs:
        assert_rows_match(out, single)


def test_the_decoder_gives_the_same_frames_in_any_chunks(monkeypatch):
    """Frames decode a cache-sized chunk at a time (`DECODE_CHUNK_BYTES`): one frame per
    chunk, the default and every frame at once give the same frames, rows alone or together
    (within the bounds across kernels: a convolution over another batch may sum in another
    order)."""
    from ardiff.pipelines.tiny_dit import decoder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        dec = LatentDecoder(4, 2).eval()
        latents, state = torch.randn(3, 2, 4, 8, 8), torch.randn(4, 8, 8)
    previous = [None, state, None]
    frames, states = {}, {}
    for name, size in [("default", decoder.DECODE_CHUNK_BYTES), ("frame", 1), ("all", 1 << 40)]:
        monkeypatch.setattr(decoder, "DECODE_CHUNK_BYTES", size)
        frames[name], states[name] = dec.decode_rows(latents, previous)
        for got, want in zip(states[name], states["default"], strict=True):
            assert_floats_close(got, want, f"decoder state, chunks of {name}")
    alone = torch.cat([dec.decode_rows(latents[row:row + 1], previous[row:row + 1])[0]
                       for row in range(3)])
    assert frames["default"].shape == (3, 2, 16, 16, 3)
    for other in (frames["frame"], frames["all"], alone):
        levels = (other.int() - frames["default"].int()).abs().max().item()
        assert levels <= FRAME_LEVELS, f"{levels} levels apart"


def test_rotate_writes_the_same_bits_as_the_stacked_form():
    """`rotate` fills one output in place; the stacked form (what a compiler sees) is the
    same products and sums."""
    from ardiff.pipelines.shared.nn import Rope, rotate

    rope = Rope.from_angles(torch.randn(2, 12, 8) * 30)
    cos, sin = rope.cos[..., None, :], rope.sin[..., None, :]
    for x in (torch.randn(2, 12, 4, 16), torch.randn(2, 12, 4, 16).bfloat16()):
        x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        stacked = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        assert torch.equal(rotate(x, rope), stacked.to(x.dtype))

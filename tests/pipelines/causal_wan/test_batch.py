"""causal-Wan's batched forward (`generate_blocks`) against its one-session one.

Sessions join at different blocks (ragged: one past its first eviction beside one that just
started), on different prompts and seeds; under CFG the rows' guidance differs (an unguided
row beside guided ones of two scales); one session switches prompt with LongLive's recache
mid-batch (`heavy`: another one past a full cache too), one is reset mid-run. Both arms run
the same requests through the runner (`tests/support/batch_drive.py`) on the paged cache
(poisoned) and the dense one.

The bound: latents within the bound across kernels (tests/support/numerics.py: a row of the
batched transformer may run other kernels than that row alone); with each session decoded
alone, frames within a level too. The batched VAE decode (sessions at one decode stage in one call) rounds differently from one
row's: within a level per call, and since a session's decoder cache carries that forward
into its later frames, which the tiny random VAE amplifies, within DECODE_LEVELS over a
rollout. Batched paged equals batched dense exactly.

The default run uses a smaller geometry than the fixtures' (32 x 32, one latent frame per
block: the VAE decode is most of a tiny block's time); `heavy` runs the fixtures' (48 x 64,
three frames per block, sink 3 and no sink) for B = 1, 2, 3, 8.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from extras import require_extra

require_extra("wan")

from numerics import assert_floats_close  # noqa: E402

import ardiff  # noqa: E402
from ardiff.errors import KVStateError  # noqa: E402
from ardiff.pipelines.causal_wan import CausalWan  # noqa: E402
from ardiff.pipelines.causal_wan.decode import StreamingDecoder  # noqa: E402
from ardiff.pipelines.causal_wan.transformer import BlockTransformer  # noqa: E402
from tests.support.batch_drive import (  # noqa: E402
    Rollout,
    assert_rows_match,
    batch_runner,
    ragged_schedule,
    run,
)

DECODE_LEVELS = 8  # batched decode, over a rollout (max seen here: 4); one call: 1

PROMPTS = ["a red ball", "a dog swims in a lake", "a cat walks on the beach"]
# Small: sink 1, window 2 of one-frame blocks: block 3 no longer sees frame 1.
SMALL = dict(height=32, width=32, frames_per_block=1, window_frames=2, sink_frames=1,
             denoising_steps=[1000, 500], session_capacity=8)
# The fixtures' geometry: sink 3, window 6 of three-frame blocks: block 3 evicts block 1.
FULL = dict(session_capacity=8)
GEOMETRIES = {"small": SMALL, "full": FULL, "no-sink": dict(FULL, sink_frames=0)}
STARTS = [0, 1, 0, 3, 0, 2, 1, 3]  # the batch at which session i joins
# (batches, {(session, block) that switches prompt with a recache}, {(session, block) reset}):
# s0 passes its first eviction at block 3 (both geometries); heavy: s0's switch at block 4
# re-runs a full cache (the full geometry's sink 3 + window 6 < its 12 frames).
QUICK = (4, {(1, 1)}, {(2, 2)})
LONG = (6, {(1, 1), (0, 4)}, {(2, 2)})


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pipelines(tiny_args):
    made: dict[tuple[str, bool], CausalWan] = {}

    def get(geometry: str, cfg: bool) -> CausalWan:
        if (geometry, cfg) not in made:
            made[geometry, cfg] = CausalWan(**{**tiny_args, **GEOMETRIES[geometry], "cfg": cfg})
            made[geometry, cfg].load("cpu", torch.float32)
        return made[geometry, cfg]

    return get


class LatentTap:
    """The latent rows [1, C, F, h, w] the pipeline decodes, in order, and rows per decode
    call."""

    def __init__(self, monkeypatch) -> None:
        self.rows: list[torch.Tensor] = []
        self.calls: list[int] = []
        decode_rows = StreamingDecoder.decode_rows

        def tapped(decoder, session_ids, latents: torch.Tensor):
            self.calls.append(latents.shape[0])
            self.rows.extend(latents[row:row + 1].clone() for row in range(latents.shape[0]))
            return decode_rows(decoder, session_ids, latents)

        monkeypatch.setattr(StreamingDecoder, "decode_rows", tapped)

    def take(self) -> list[torch.Tensor]:
        rows, self.rows = self.rows, []
        return rows


def requests_for(cfg: bool, switches: set = frozenset(), resets: set = frozenset()):
    def request(i: int, k: int) -> ardiff.RolloutRequest:
        """Session i's block k: a new prompt from each switch on (its block recaches), a
        reset where `resets` says; under CFG rows take scales 1 (unguided), 3, 2, 1, ..."""
        switched = sum(1 for j, at in switches if j == i and at <= k)
        return ardiff.RolloutRequest(
            f"s{i}", block_index=k, seed=30 + i, prompt=PROMPTS[(i + switched) % 3],
            negative_prompt="blurry", guidance_scale=(1.0, 3.0, 2.0)[i % 3] if cfg else 1.0,
            reset=(i, k) in resets, clear_cross_kv=(i, k) in switches,
            extra={"recache": True} if (i, k) in switches else {})
    return request


def decode_alone(monkeypatch) -> None:
    """Each session's block decoded by itself (`decode`), as one session's forward does."""
    def per_row(decoder, session_ids, latents):
        return [decoder.decode(sid, latents[row:row + 1]) for row, sid in enumerate(session_ids)]

    monkeypatch.setattr(StreamingDecoder, "decode_rows", per_row)


def assert_within_decode_bound(batched: Rollout, single: Rollout) -> None:
    """Latents within the bound across kernels, frames within DECODE_LEVELS."""
    assert batched.frames.keys() == single.frames.keys()
    for session, blocks in single.frames.items():
        assert len(batched.frames[session]) == len(blocks) == len(single.latents[session])
        for index, (got, want) in enumerate(zip(batched.frames[session], blocks)):
            assert got.shape == want.shape, (session, index)
            levels = (got.int() - want.int()).abs().max().item()
            assert levels <= DECODE_LEVELS, f"session {session} block {index}: {levels} levels"
        for index, (got, want) in enumerate(zip(batched.latents[session],
                                                single.latents[session], strict=True)):
            assert_floats_close(got, want, f"session {session} block {index}: latents")


def check_batched_equals_single(pipelines, monkeypatch, geometry: str, rows: int,
                                backend: str, cfg: bool, plan=QUICK, dense_too=False,
                                batched_decode=True) -> None:
    """Batched = one session per forward: within the bound across kernels with each session
    decoded alone, else within the decode bound; with `dense_too` the batched run on the
    other backend equals it exactly (the same kernels)."""
    if not batched_decode:
        decode_alone(monkeypatch)
    tap = LatentTap(monkeypatch)
    pipeline = pipelines(geometry, cfg)
    num_batches, switches, resets = plan
    schedule = ragged_schedule(STARTS[:rows], num_batches, requests_for(cfg, switches, resets))
    assert max(len(batch) for batch in schedule) == rows
    batched = run(batch_runner(pipeline, backend, rows), schedule, batched=True, tap=tap)
    single = run(batch_runner(pipeline, backend, rows), schedule, batched=False, tap=tap)
    assert len(single.latents["s0"]) == num_batches
    if batched_decode:
        assert_within_decode_bound(batched, single)
    else:
        assert_rows_match(batched, single)
    if dense_too:
        other = "dense" if backend == "paged" else "paged"
        again = run(batch_runner(pipeline, other, rows), schedule, batched=True, tap=tap)
        assert_rows_match(again, batched, exact=True)


def test_batched_blocks_equal_one_session_blocks_bit_for_bit_under_cfg(pipelines,
                                                                       monkeypatch):
    check_batched_equals_single(pipelines, monkeypatch, "small", 3, "paged", cfg=True,
                                batched_decode=False)


def test_batched_decode_within_its_bound_and_paged_equals_dense(pipelines, monkeypatch):
    check_batched_equals_single(pipelines, monkeypatch, "small", 2, "dense", cfg=False,
                                dense_too=True)


@pytest.mark.heavy
@pytest.mark.parametrize("rows, backend, cfg, batched_decode",
                         list(itertools.product((1, 2, 3, 8), ("paged", "dense"), (False, True),
                                                (True, False))))
def test_batched_blocks_equal_one_session_blocks_everywhere(pipelines, monkeypatch, rows,
                                                            backend, cfg, batched_decode):
    check_batched_equals_single(pipelines, monkeypatch, "full", rows, backend, cfg, plan=LONG,
                                dense_too=rows > 1, batched_decode=batched_decode)


@pytest.mark.heavy
@pytest.mark.parametrize("cfg", (False, True))
def test_batched_blocks_equal_one_session_blocks_without_a_sink(pipelines, monkeypatch, cfg):
    check_batched_equals_single(pipelines, monkeypatch, "no-sink", 8, "paged", cfg, plan=LONG,
                                dense_too=True, batched_decode=False)


def test_batched_decodes_stay_within_the_bound_of_each_session_alone(pipelines):
    """Three sessions past their first blocks (different histories), two blocks decoded in
    one call each, against each session decoding the same latents from a copy of the same
    cache: the first call within one level, the next (reading the caches the first wrote
    back, row by row) within DECODE_LEVELS."""
    decoder = pipelines("small", False).decoder
    generator = torch.Generator().manual_seed(1)
    sessions = ["a", "b", "c"]
    for _ in range(2):
        for sid in sessions:
            decoder.decode(sid, torch.randn((1, 16, 1, 4, 4), generator=generator))
    caches = {sid: list(decoder.caches[sid]) for sid in sessions}
    blocks = [torch.randn((3, 16, 1, 4, 4), generator=generator) for _ in range(2)]
    together = [decoder.decode_rows(sessions, latents) for latents in blocks]
    for row, sid in enumerate(sessions):
        decoder.caches[sid] = list(caches[sid])
        alone = [decoder.decode(sid, latents[row:row + 1]) for latents in blocks]
        for block, bound in enumerate((1, DECODE_LEVELS)):
            levels = (together[block][row].int() - alone[block].int()).abs().max()
            assert levels <= bound, (sid, block, int(levels))
        decoder.forget(sid)



def test_a_batch_is_one_transformer_forward_per_branch_and_step(pipelines, monkeypatch):
    """s0 (unguided) and s1 (guided) at their second block beside s2 (guided at another
    scale) at its first: each step one probe of all 3 rows on `positive` and one of the 2
    guided rows on `negative`, then one commit of 3 rows per branch; the decoder runs once
    for the two later blocks and once for the first."""
    forwards: list[int] = []
    decodes: list[int] = []
    flow_rows, decode_group = BlockTransformer.flow_rows, StreamingDecoder._decode_group

    def counted_flow(self, x, *args, **kwargs):
        forwards.append(x.shape[0])
        return flow_rows(self, x, *args, **kwargs)

    def counted_decode(self, session_ids, latents):
        decodes.append(len(session_ids))
        return decode_group(self, session_ids, latents)

    monkeypatch.setattr(BlockTransformer, "flow_rows", counted_flow)
    monkeypatch.setattr(StreamingDecoder, "_decode_group", counted_decode)
    pipeline = pipelines("small", True)
    schedule = ragged_schedule([0, 0, 1], 2, requests_for(cfg=True))
    run(batch_runner(pipeline, "paged", 3), schedule, batched=True)
    steps = len(pipeline.config.timesteps())
    assert forwards == [2, 1] * steps + [2, 2] + [3, 2] * steps + [3, 3]
    assert decodes == [2, 2, 1]


def test_rows_at_different_frames_and_timesteps_equal_each_row_alone(pipelines):
    """flow_rows of two sessions at frames 0 and 2, at t = 700 and 300, each on its own
    prompt, equals each session's one-row flow within 1e-5 (RoPE and timestep per row)."""
    from ardiff.kv.backend import create_cache
    from ardiff.kv.batch import KVStateBatch
    from ardiff.kv.plan import make_plan
    from ardiff.kv.state import open_state

    pipeline = pipelines("small", False)
    model, spec = pipeline.transformer, pipeline.ar_diffusion_kv_cache_spec()
    cache = create_cache(make_plan(spec, "float32", 4, 1 << 26, max_sessions=2, batch_rows=2),
                         "paged", "cpu", poison=True)
    states = [open_state(cache, "a"), open_state(cache, "b")]
    cross = [model.text_kv(pipeline.prompt_encoder.encode(p)) for p in PROMPTS[:2]]
    latents = torch.randn((2, 16, 3, 4, 4), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for frame in range(2):  # b: two committed frames
            with states[1].block("main", commit=True) as blk:
                model.flow(latents[1:, :, frame:frame + 1], 0.0, blk, cross[1])
        alone = []
        for row, t in enumerate((700.0, 300.0)):
            with states[row].block("main") as blk:
                alone.append(model.flow(latents[row:row + 1, :, 2:], t, blk, cross[row]))
        per_row = [([a[0], b[0]], [a[1], b[1]]) for a, b in zip(*cross)]
        with KVStateBatch(states).block("main") as blk:
            assert blk.start_frames == [0, 2]
            together = model.flow_rows(latents[:, :, 2:], [700.0, 300.0], blk, per_row)
    for row in range(2):
        error = (together[row] - alone[row][0]).abs().max() / alone[row].abs().max()
        assert error <= 1e-5, (row, float(error))  # two timesteps' embeddings: not bit-equal
    for state in states:
        state.close()


def test_a_batch_with_a_session_outside_its_bind_raises(pipelines):
    from ardiff.kv.backend import create_cache
    from ardiff.kv.batch import KVStateBatch
    from ardiff.kv.plan import make_plan
    from ardiff.kv.state import open_state

    pipeline = pipelines("small", False)
    spec = pipeline.ar_diffusion_kv_cache_spec()
    cache = create_cache(make_plan(spec, "float32", 4, 1 << 26, max_sessions=2, batch_rows=2),
                         "paged", "cpu")
    states = KVStateBatch([open_state(cache, "a"), open_state(cache, "b")])
    requests = [ardiff.RolloutRequest("a"), ardiff.RolloutRequest("b")]
    with pipeline.bind_ar_diffusion_state("a", states[0]):
        with pytest.raises(KVStateError, match=r"session 'b' outside its "
                                               r"bind_ar_diffusion_state"):
            pipeline.generate_blocks(requests, states)
    for state in states:
        state.close()

"""`Runner.execute_batch` (docs/design.md#5-runner-and-sessions): several sessions in one
forward, admitted together, failed closed together.

The batch pipelines (tests/support/batch_pipelines.py) are the probe pipeline with a
`generate_blocks`: every attend checks it got the mean of exactly the frames its session
should see, and the paged cache poisons freed pages, so a page of the wrong session, a
page given back too early or a history cut short fails the forward.
"""

from __future__ import annotations

import batch_pipelines as batch
import probe_pipeline as probe
import pytest
from runner_support import BIG_BUDGET, HISTORY_PAGES, frame_ids, pages_in_use, run

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.errors import BlockOutputError, CapacityError, PipelineError, SessionError
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan

BATCH_PIPELINES = [batch.RowBatchProbe, batch.AttendBatchProbe]


def make_runner(pipeline, capacity: int, backend: str = "paged", batch_rows: int = 4) -> Runner:
    """A runner whose plan holds `batch_rows` blocks in flight (one per row of a batch)."""
    plan = make_plan(get_spec(pipeline), "float32", 4, BIG_BUDGET, max_sessions=capacity,
                     batch_rows=batch_rows)
    return Runner(pipeline, create_cache(plan, backend, "cpu", poison=backend == "paged"))


def requests(*sessions: tuple[str, int], **fields) -> list[ardiff.RolloutRequest]:
    return [ardiff.RolloutRequest(sid, block_index=b, **fields) for sid, b in sessions]


def ragged_run(runner) -> list[list[int]]:
    """Session a alone for 3 blocks (past its first eviction), then a, b and c together."""
    frames = [frame_ids(o) for o in run(runner, "a", 3)]
    for b in range(3):
        results = runner.execute_batch(requests(("a", 3 + b), ("b", b), ("c", b)))
        frames += [frame_ids(r.output) for r in results]
    return frames


# -- equal to one session per forward --------------------------------------------------------
@pytest.mark.parametrize("backend", ["paged", "dense"])
@pytest.mark.parametrize("cls", BATCH_PIPELINES)
def test_a_batch_makes_what_one_session_per_forward_makes(cls, backend):
    batched, single = make_runner(cls(), 8, backend), make_runner(probe.ProbePipeline(), 8, backend)

    frames = ragged_run(batched)
    expected = [frame_ids(o) for o in run(single, "a", 6)]
    expected_b = [frame_ids(o) for o in run(single, "b", 3)]

    assert frames[:3] == expected[:3] and frames[3::3] == expected[3:]
    assert frames[4::3] == expected_b == frames[5::3]
    seen = lambda p, sid: [(r.start_frame, r.visible_frames)  # noqa: E731
                           for r in p.blocks if r.session_id == sid]
    assert seen(batched.pipeline, "a") == seen(single.pipeline, "a")
    assert seen(batched.pipeline, "b") == seen(single.pipeline, "b") == seen(batched.pipeline, "c")
    assert batched.pipeline.batch_calls == [["a", "b", "c"]] * 3
    stats = batched.stats()
    assert stats.batch_sizes == {1: 3, 3: 3} and len(stats.block_latencies_s) == 12
    if backend == "paged":
        assert stats.cache.pages_in_use == 3 * HISTORY_PAGES


def test_every_result_of_a_batch_carries_its_forwards_latency():
    runner = make_runner(batch.RowBatchProbe(), 4)

    results = runner.execute_batch(requests(("a", 0), ("b", 0)))

    assert results[0].latency_s == results[1].latency_s > 0
    assert runner.stats().block_latencies_s == [results[0].latency_s] * 2


def test_the_binds_are_entered_in_request_order_and_exited_in_reverse():
    runner = make_runner(batch.RowBatchProbe(), 4)

    runner.execute_batch(requests(("b", 0), ("a", 0), ("c", 0)))

    assert runner.pipeline.bind_events == [("enter", "b"), ("enter", "a"), ("enter", "c"),
                                           ("exit", "c"), ("exit", "a"), ("exit", "b")]


def test_a_reset_in_a_batch_restarts_only_its_session():
    runner = make_runner(batch.RowBatchProbe(), 4)
    run(runner, "a", 2)
    run(runner, "b", 2)

    results = runner.execute_batch([ardiff.RolloutRequest("a", 0, reset=True),
                                    ardiff.RolloutRequest("b", 2)])

    assert [frame_ids(r.output) for r in results] == [[0, 1], [4, 5]]
    assert ("reset", "a") in runner.pipeline.hook_calls
    assert runner.stats().sessions["reset"] == 1


def test_a_pipeline_without_generate_blocks_runs_one_session_per_forward():
    runner = make_runner(probe.ProbePipeline(), 2, batch_rows=1)

    results = runner.execute_batch(requests(("a", 0), ("b", 0)))

    assert [frame_ids(r.output) for r in results] == [[0, 1], [0, 1]]
    assert runner.stats().batch_sizes == {1: 2}
    assert runner.pipeline.bind_events == [("enter", "a"), ("exit", "a"),
                                           ("enter", "b"), ("exit", "b")]


# -- admission -------------------------------------------------------------------------------
def test_a_batch_never_evicts_one_of_its_own_sessions():
    runner = make_runner(batch.RowBatchProbe(), 3)
    run(runner, "b", 2)   # the least recently used: a member of the batch below
    run(runner, "x", 1)
    run(runner, "y", 1)

    results = runner.execute_batch(requests(("c", 0), ("b", 2)))  # c admitted first

    assert [frame_ids(r.output) for r in results] == [[0, 1], [4, 5]]  # b kept its history
    assert ("close", "x") in runner.pipeline.hook_calls
    assert set(runner.sessions.session_ids) == {"y", "b", "c"}
    assert runner.stats().sessions["evicted"] == 1


def test_a_batch_larger_than_the_plan_holds_is_refused_before_anything_changes():
    runner = make_runner(batch.RowBatchProbe(), 2)
    run(runner, "a", 1)

    with pytest.raises(CapacityError, match=r"^batch: 3 sessions in one forward, but the memory "
                       r"plan holds 2 resident .*; run at most 2 per batch"):
        runner.execute_batch(requests(("a", 1), ("b", 0), ("c", 0)))
    assert runner.sessions.session_ids == ["a"] and runner.pipeline.batch_calls == []


def test_a_batch_larger_than_the_plans_blocks_in_flight_is_refused():
    runner = make_runner(batch.AttendBatchProbe(), 4, batch_rows=2)

    with pytest.raises(CapacityError, match=r"^batch: 3 sessions in one forward, but the memory "
                       r"plan holds blocks in flight for 2 \(its batch_rows\); run at most 2"):
        runner.execute_batch(requests(("a", 0), ("b", 0), ("c", 0)))
    assert len(runner.sessions) == 0
    assert len(runner.execute_batch(requests(("a", 0), ("b", 0)))) == 2


@pytest.mark.parametrize("sessions, message", [
    ((("a", 0), ("a", 1)), r"^batch: session 'a' appears twice; a batch runs one block per "
                           r"session"),
    ((("a", 0), ("__ardiff_warmup__", 0)), r"^batch: session id '__ardiff_warmup__' is "
                                           r"reserved for warmup"),
])
def test_a_session_twice_or_the_warmup_session_is_refused(sessions, message):
    runner = make_runner(batch.RowBatchProbe(), 4)

    with pytest.raises(SessionError, match=message):
        runner.execute_batch(requests(*sessions))
    assert len(runner.sessions) == 0


# -- failing closed --------------------------------------------------------------------------
@pytest.mark.parametrize("cls", BATCH_PIPELINES)
def test_a_forward_that_raises_fails_exactly_the_sessions_of_its_batch(cls):
    runner = make_runner(cls(fail_session="c"), 4)
    run(runner, "outside", 3)
    run(runner, "a", 1)

    with pytest.raises(PipelineError, match=r"^batch of 3 sessions \('a' block 1, 'b' block 0, "
                       r"'c' block 0\): generate_blocks raised RuntimeError: injected batch "
                       r"fault at 'c' block 0; every session of the batch failed closed"):
        runner.execute_batch(requests(("a", 1), ("b", 0), ("c", 0)))

    hooks = runner.pipeline.hook_calls
    assert {("close", "a"), ("close", "b"), ("close", "c")} <= set(hooks)
    assert ("close", "outside") not in hooks
    assert runner.sessions.session_ids == ["outside"]
    assert pages_in_use(runner) == HISTORY_PAGES  # the outside session's alone
    assert runner.stats().sessions["failed"] == 3
    assert frame_ids(run(runner, "outside", 1, first_block=3)[0]) == [6, 7]
    assert frame_ids(run(runner, "a", 1)[0]) == [0, 1]  # a starts over


def test_a_block_left_open_fails_the_batch_with_its_pages_back():
    runner = make_runner(batch.RowBatchProbe(leave_open_session="b"), 4)

    with pytest.raises(PipelineError, match=r"^batch of 2 sessions .*: generate_blocks: returned "
                       r"with a probe block of branch 'main' \(session 'b'\) still open"):
        runner.execute_batch(requests(("a", 0), ("b", 0)))
    assert pages_in_use(runner) == 0 and len(runner.sessions) == 0


def test_one_output_too_few_fails_the_batch():
    runner = make_runner(batch.RowBatchProbe(drop_output=True), 4)

    with pytest.raises(BlockOutputError, match=r"^batch of 2 sessions .*: generate_blocks: "
                       r"returned 1 outputs; expected a list of 2 BlockOutput, one per request"):
        runner.execute_batch(requests(("a", 0), ("b", 0)))
    assert pages_in_use(runner) == 0 and runner.stats().sessions["failed"] == 2


def test_a_bad_output_of_one_row_names_its_session_and_fails_the_batch():
    class BadRow(batch.RowBatchProbe):
        def _output(self, request, frames):
            return ardiff.BlockOutput(frames.float() if request.session_id == "b" else frames)

    runner = make_runner(BadRow(), 4)

    with pytest.raises(BlockOutputError, match=r"^batch of 2 sessions .*: generate_blocks' "
                       r"outputs: session 'b' block 0: BlockOutput.frames is torch.float32"):
        runner.execute_batch(requests(("a", 0), ("b", 0)))
    assert pages_in_use(runner) == 0


def test_an_interrupt_in_a_batch_passes_through_with_every_session_released():
    class Interrupted(batch.RowBatchProbe):
        def _batch_fault(self, request, state):
            if request.session_id == "b":
                raise KeyboardInterrupt

    runner = make_runner(Interrupted(), 4)

    with pytest.raises(KeyboardInterrupt):
        runner.execute_batch(requests(("a", 0), ("b", 0)))
    assert pages_in_use(runner) == 0 and len(runner.sessions) == 0


def test_a_subclass_that_overrides_generate_block_alone_runs_one_session_per_forward():
    """Its override (a fault, a log, a changed output) would be bypassed by the inherited
    batched forward, so ardiff does not batch it; its own generate_blocks restores batching."""
    from ardiff.engine.batching import supports_batches
    from ardiff.pipelines.tiny_dit.pipeline import TinyCausalDiT

    class Wrapped(TinyCausalDiT):
        def generate_block(self, request, state):
            return super().generate_block(request, state)

    class WrappedBoth(Wrapped):
        def generate_blocks(self, requests, states):
            return super().generate_blocks(requests, states)

    assert supports_batches(TinyCausalDiT.__new__(TinyCausalDiT))
    assert not supports_batches(Wrapped.__new__(Wrapped))
    assert supports_batches(WrappedBoth.__new__(WrappedBoth))

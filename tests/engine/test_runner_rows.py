"""`Runner.execute_rows`: a batched forward whose one row fails fails that row's session
only when nothing of the forward was committed (each row runs again on its own, the
others' blocks as if the batch had not failed); one that failed after committing fails
every row, as `execute_batch` does."""

from __future__ import annotations

import batch_pipelines as batch
import probe_pipeline as probe
from runner_support import BIG_BUDGET, frame_ids, run

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan


def make_runner(pipeline, capacity: int) -> Runner:
    plan = make_plan(get_spec(pipeline), "float32", 4, BIG_BUDGET, max_sessions=capacity,
                     batch_rows=4)
    return Runner(pipeline, create_cache(plan, "paged", "cpu", poison=True))


def requests(*sessions: tuple[str, int], **fields) -> list[ardiff.RolloutRequest]:
    return [ardiff.RolloutRequest(sid, block_index=b, **fields) for sid, b in sessions]


def _boom(reqs) -> None:
    if any(r.prompt == "boom" and r.block_index >= 1 for r in reqs):
        raise RuntimeError("boom row")


class BoomBeforeKV(batch.RowBatchProbe):
    """Raises for a "boom" row at block 1 and later, before any KV is touched (batched or
    alone)."""

    def generate_blocks(self, reqs, states):
        _boom(reqs)
        return super().generate_blocks(reqs, states)

    def generate_block(self, request, state):
        _boom([request])
        return super().generate_block(request, state)


class BoomAfterCommit(batch.RowBatchProbe):
    """Raises for a "boom" row at block 1 and later, after the forward committed."""

    def generate_blocks(self, reqs, states):
        outputs = super().generate_blocks(reqs, states)
        _boom(reqs)
        return outputs


def _pair(block: int) -> list[ardiff.RolloutRequest]:
    return [requests(("a", block), prompt="boom")[0], requests(("b", block), prompt="fine")[0]]


def test_a_row_failing_before_any_commit_fails_only_its_session():
    runner = make_runner(BoomBeforeKV(), 4)
    first = runner.execute_rows(_pair(0))
    assert all(isinstance(r, ardiff.BlockResult) for r in first)
    second = runner.execute_rows(_pair(1))
    assert isinstance(second[0], Exception) and "boom row" in str(second[0])
    assert isinstance(second[1], ardiff.BlockResult)
    assert "a" not in runner.sessions and "b" in runner.sessions  # a released, b goes on
    third = runner.execute_rows([requests(("b", 2), prompt="fine")[0]])
    alone = make_runner(probe.ProbePipeline(), 4)
    expected = [frame_ids(o) for o in run(alone, "b", 3, prompt="fine")]
    assert [frame_ids(r.output) for r in (first[1], second[1], third[0])] == expected


def test_a_row_failing_after_the_commit_fails_every_row():
    runner = make_runner(BoomAfterCommit(), 4)
    runner.execute_rows(_pair(0))
    results = runner.execute_rows(_pair(1))
    assert all(isinstance(r, Exception) for r in results)
    assert "a" not in runner.sessions and "b" not in runner.sessions

"""The runner (docs/design.md#5-runner-and-sessions): sessions, LRU eviction, the one release path, warmup, output checks.

The pipelines are small but real (tests/support/probe_pipeline.py): every
block runs probes and a commit through the KV state API and checks that the
attention it gets back is the mean of exactly the frames it should see, so a
page handed back too early, too late or to the wrong session shows. The paged
cache poisons freed pages with NaN.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

import ardiff
from ardiff.config.run import load_config
from ardiff.engine.build import build_runner
from ardiff.engine.runner import WARMUP_SESSION_ID
from ardiff.kv.plan import make_plan, required_bytes
from ardiff.kv.state import open_state

PIPELINES_FILE = Path(__file__).parents[1] / "support" / "probe_pipeline.py"

import probe_pipeline as probe
from runner_support import HISTORY_PAGES, frame_ids, make_runner, pages_in_use, probe_config, run


# -- a session's blocks -----------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["paged", "dense"])
def test_blocks_of_a_session_continue_at_absolute_positions(backend):
    runner = make_runner(backend=backend)
    outputs = run(runner, "a", 4)
    assert [frame_ids(o) for o in outputs] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    record = runner.pipeline.blocks[-1]
    assert (record.start_frame, record.visible_frames) == (6, (0, 4, 5))  # sink + last 2
    stats = runner.stats()
    assert len(stats.block_latencies_s) == 4 and stats.warmup_latencies_s == []
    assert stats.sessions == dict(created=1, reset=0, closed=0, evicted=0, failed=0, resident=1)
    if backend == "paged":
        assert stats.cache.pages_in_use == HISTORY_PAGES


def test_sessions_are_isolated():
    runner = make_runner()
    run(runner, "a", 3)
    assert frame_ids(run(runner, "b", 1)[0]) == [0, 1]
    assert frame_ids(run(runner, "a", 1, first_block=3)[0]) == [6, 7]
    assert pages_in_use(runner) == HISTORY_PAGES + 2  # "b" holds one block of 2 frames


# -- LRU eviction -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["paged", "dense"])
def test_lru_eviction_closes_the_oldest_session_and_frees_its_kv(backend):
    runner = make_runner(capacity=2, backend=backend)
    pipeline, cache = runner.pipeline, runner.cache
    run(runner, "a", 2)
    run(runner, "b", 2)
    run(runner, "a", 1, first_block=2)  # "b" is now the least recently used
    assert cache.cross.num_entries("b") == 1 and "b" in pipeline.model_state

    run(runner, "c", 2)

    assert pipeline.hook_calls[-3:] == [("close", "b"), ("generate", "c"), ("generate", "c")]
    assert sorted(cache.session_ids) == ["a", "c"] and runner.sessions.session_ids == ["a", "c"]
    assert cache.cross.num_entries("b") == 0 and "b" not in pipeline.model_state
    if backend == "paged":
        assert pages_in_use(runner) == 2 * HISTORY_PAGES
    counts = runner.stats().sessions
    assert (counts["created"], counts["evicted"], counts["resident"]) == (3, 1, 2)

    assert frame_ids(run(runner, "b", 1)[0]) == [0, 1]  # back from frame 0; "a" goes now
    assert ("close", "a") in pipeline.hook_calls and runner.stats().sessions["evicted"] == 2


def test_a_small_byte_budget_lowers_capacity_and_drives_lru(tmp_path):
    spec = probe.ProbePipeline().ar_diffusion_kv_cache_spec()
    unbounded = make_plan(spec, "float32", 4, 1 << 40)
    budget = required_bytes(unbounded, 2) + unbounded.bytes_per_session - 1  # 2 fit, not 3
    runner = build_runner(load_config(probe_config(tmp_path, memory_budget=budget)))
    plan = runner.plan
    assert (plan.spec.session_capacity, plan.session_capacity, plan.budget_bytes) == (8, 2, budget)
    assert runner.cache.stats().pages_total == 2 * HISTORY_PAGES + plan.inflight_pages

    for sid in ("a", "b", "c"):
        run(runner, sid, 2)

    assert ("close", "a") in runner.pipeline.hook_calls
    assert runner.sessions.session_ids == ["b", "c"] and runner.stats().sessions["evicted"] == 1
    assert pages_in_use(runner) == 2 * HISTORY_PAGES


# -- reset and close ----------------------------------------------------------------------------
def test_reset_releases_before_the_forward_and_restarts_at_frame_0():
    runner = make_runner()
    run(runner, "a", 3)
    before = runner.pipeline.model_state["a"].cross_sets

    output = runner.execute(ardiff.RolloutRequest("a", block_index=3, reset=True)).output

    assert frame_ids(output) == [0, 1]
    assert runner.pipeline.hook_calls[-2:] == [("reset", "a"), ("generate", "a")]
    assert ("close", "a") not in runner.pipeline.hook_calls
    record = runner.pipeline.blocks[-1]
    assert (record.start_frame, record.visible_frames) == (0, ())
    # Fresh model state, and it found no cross K/V, so it set them again.
    assert runner.pipeline.model_state["a"].cross_sets == 1 == before
    assert pages_in_use(runner) == 2  # one block of history
    counts = runner.stats().sessions
    assert (counts["reset"], counts["resident"]) == (1, 1)


def test_reset_of_a_new_session_runs_the_reset_hook_then_starts_it():
    runner = make_runner()
    output = runner.execute(ardiff.RolloutRequest("new", reset=True)).output
    assert frame_ids(output) == [0, 1] and runner.stats().sessions["reset"] == 0
    assert runner.pipeline.hook_calls == [("reset", "new"), ("generate", "new")]


@pytest.mark.parametrize("backend", ["paged", "dense"])
def test_close_session_closes_after_a_successful_forward(backend):
    runner = make_runner(backend=backend)
    run(runner, "a", 2)

    output = runner.execute(ardiff.RolloutRequest("a", block_index=2, close_session=True)).output

    assert frame_ids(output) == [4, 5]  # the block ran on the history, then closed
    assert runner.pipeline.hook_calls[-2:] == [("generate", "a"), ("close", "a")]
    assert "a" not in runner.sessions and not runner.cache.has_session("a")
    assert runner.cache.cross.num_entries() == 0 and runner.pipeline.model_state == {}
    if backend == "paged":
        assert pages_in_use(runner) == 0
    assert runner.stats().sessions["closed"] == 1
    assert frame_ids(run(runner, "a", 1)[0]) == [0, 1]


def test_close_session_by_id_and_unknown_ids():
    runner = make_runner()
    run(runner, "a", 2)
    runner.close_session("a")
    assert runner.pipeline.hook_calls[-1] == ("close", "a") and pages_in_use(runner) == 0
    with pytest.raises(ardiff.SessionError, match="'a' is not resident"):
        runner.close_session("a")


def test_close_releases_every_session_once_and_closes_the_runner():
    runner = make_runner()
    run(runner, "a", 2)
    run(runner, "b", 1)
    runner.close()
    runner.close()  # safe twice
    closes = [call for call in runner.pipeline.hook_calls if call[0] == "close"]
    assert sorted(closes) == [("close", "a"), ("close", "b")]
    assert pages_in_use(runner) == 0 and runner.cache.cross.num_entries() == 0
    with pytest.raises(ardiff.SessionError, match="closed"):
        run(runner, "a", 1)


def test_a_closed_state_is_unusable():
    cache = make_runner().cache
    with contextlib.closing(open_state(cache, "a")) as state:
        assert state.num_committed_frames("main") == 0
    with pytest.raises(ardiff.KVStateError, match="after its bind ended"):
        state.num_committed_frames("main")


def test_the_warmup_session_id_is_reserved():
    runner = make_runner()
    with pytest.raises(ardiff.SessionError, match="reserved for warmup"):
        runner.execute(ardiff.RolloutRequest(WARMUP_SESSION_ID))
    assert runner.pipeline.hook_calls == [] and len(runner.sessions) == 0


# -- failure: fail closed --------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["paged", "dense"])
@pytest.mark.parametrize("stage", ["probe", "commit", "after_commit"])
def test_an_exception_in_the_forward_releases_everything(stage, backend):
    runner = make_runner(probe.FailingForwardPipeline(fail_at_block=2, fail_stage=stage),
                         backend=backend)
    run(runner, "other", 1)
    run(runner, "a", 2)

    with pytest.raises(ardiff.PipelineError, match=r"session 'a' block 2: generate_block "
                                                   r"raised RuntimeError: injected") as info:
        run(runner, "a", 1, first_block=2)

    assert isinstance(info.value.__cause__, RuntimeError)
    assert runner.pipeline.hook_calls[-1] == ("close", "a")
    assert "a" not in runner.sessions and not runner.cache.has_session("a")
    assert runner.cache.cross.num_entries("a") == 0 and "a" not in runner.pipeline.model_state
    if backend == "paged":
        assert pages_in_use(runner) == 2  # only "other" (one block) holds pages
    counts = runner.stats().sessions
    assert (counts["failed"], counts["resident"]) == (1, 1)
    assert len(runner.stats().block_latencies_s) == 3  # the failed block has none

    assert frame_ids(run(runner, "a", 1)[0]) == [0, 1]  # the same session restarts at frame 0
    assert frame_ids(run(runner, "other", 1, first_block=1)[0]) == [2, 3]  # untouched


def test_an_ardiff_error_in_the_forward_propagates_as_is_after_release():
    runner = make_runner(probe.FailingForwardPipeline(fail_at_block=0, fail_stage="bad_attend"))
    with pytest.raises(ardiff.KVStateError, match="k has shape"):
        run(runner, "a", 1)
    assert pages_in_use(runner) == 0 and runner.stats().sessions["failed"] == 1
    assert runner.pipeline.hook_calls[-1] == ("close", "a")


def test_an_interrupt_in_the_forward_releases_then_propagates():
    runner = make_runner(probe.FailingForwardPipeline(fail_at_block=1, fail_stage="interrupt"))
    run(runner, "a", 1)
    with pytest.raises(KeyboardInterrupt):
        run(runner, "a", 1, first_block=1)
    assert pages_in_use(runner) == 0 and "a" not in runner.sessions
    assert runner.pipeline.hook_calls[-1] == ("close", "a")


# -- cleanup errors are collected; every step runs --------------------------------------------
def test_a_failing_close_hook_after_a_failed_forward_keeps_the_first_error():
    pipeline = probe.FailingHooksPipeline(fail_hooks=("close",), fail_at_block=1)
    runner = make_runner(pipeline)
    run(runner, "a", 1)

    with pytest.raises(ardiff.PipelineError, match="injected fault at block 1") as info:
        run(runner, "a", 1, first_block=1)

    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "while releasing session 'a'" in notes and "injected close hook fault" in notes
    assert pages_in_use(runner) == 0 and runner.cache.cross.num_entries() == 0
    assert "a" not in runner.sessions and runner.stats().sessions["failed"] == 1


def test_a_failing_close_hook_on_eviction_still_frees_the_session():
    runner = make_runner(probe.FailingHooksPipeline(fail_hooks=("close",)), capacity=1)
    run(runner, "a", 2)
    with pytest.raises(ardiff.PipelineError, match=r"releasing session 'a' \(evicted\): "
                                                   r"RuntimeError: injected close hook"):
        run(runner, "b", 1)
    assert pages_in_use(runner) == 0 and runner.cache.session_ids == []
    assert runner.stats().sessions["evicted"] == 1
    assert frame_ids(run(runner, "b", 1)[0]) == [0, 1]  # room was made; "b" runs now


def test_a_failing_reset_hook_still_releases_the_kv():
    runner = make_runner(probe.FailingHooksPipeline(fail_hooks=("reset",)))
    run(runner, "a", 2)
    with pytest.raises(ardiff.PipelineError, match=r"'a' \(reset\).*injected reset hook"):
        runner.execute(ardiff.RolloutRequest("a", block_index=2, reset=True))
    assert pages_in_use(runner) == 0 and "a" not in runner.sessions
    assert runner.pipeline.hook_calls[-1] == ("reset", "a")  # the forward did not run
    assert frame_ids(run(runner, "a", 1)[0]) == [0, 1]


def test_a_failing_close_hook_on_close_session_still_releases():
    runner = make_runner(probe.FailingHooksPipeline(fail_hooks=("close",)))
    with pytest.raises(ardiff.PipelineError, match=r"'a' \(closed\)"):
        runner.execute(ardiff.RolloutRequest("a", close_session=True))
    assert pages_in_use(runner) == 0 and "a" not in runner.sessions


def test_runner_close_runs_every_release_even_when_hooks_raise():
    runner = make_runner(probe.FailingHooksPipeline(fail_hooks=("close",)))
    run(runner, "a", 2)
    run(runner, "b", 2)
    with pytest.raises(ardiff.PipelineError, match="closing the runner"):
        runner.close()
    assert sorted(c for c in runner.pipeline.hook_calls if c[0] == "close") == [
        ("close", "a"), ("close", "b")]
    assert pages_in_use(runner) == 0 and len(runner.sessions) == 0
    runner.close()  # already closed: nothing runs twice


def test_a_failing_kv_release_still_calls_the_hook(monkeypatch):
    runner = make_runner()
    run(runner, "a", 1)

    def broken_release(session_id):
        raise RuntimeError("injected KV release fault")

    monkeypatch.setattr(runner.cache, "release_session", broken_release)
    with pytest.raises(ardiff.PipelineError, match="injected KV release fault"):
        runner.close_session("a")
    assert runner.pipeline.hook_calls[-1] == ("close", "a") and "a" not in runner.sessions


# -- BlockOutput validation -------------------------------------------------------------------
@pytest.mark.parametrize("bad, message", [
    ("dtype", r"frames is torch.float32; expected torch.uint8"),
    ("channels", r"frames has shape \(2, 4, 4, 4\); expected \[F > 0, H > 0, W > 0, 3\]"),
    ("dims", r"frames has shape \(4, 4, 3\); expected \[F > 0"),
    ("empty", r"frames has shape \(0, 4, 4, 3\)"),
    ("not_output", r"BlockOutput expected, got Tensor"),
    ("not_tensor", r"frames is a list; expected a uint8 tensor \[F, H, W, 3\]"),
])
def test_a_broken_block_output_is_named_and_fails_the_session(bad, message):
    runner = make_runner(probe.BadOutputPipeline(bad=bad, at_block=1))
    run(runner, "a", 1)
    with pytest.raises(ardiff.BlockOutputError, match=r"session 'a' block 1: BlockOutput") as info:
        run(runner, "a", 1, first_block=1)
    assert re.search(message, str(info.value))
    assert pages_in_use(runner) == 0 and runner.stats().sessions["failed"] == 1
    assert runner.pipeline.hook_calls[-1] == ("close", "a")


def test_frame_size_must_stay_the_same_within_a_session_only():
    runner = make_runner(probe.BadOutputPipeline(bad="size", at_block=1))
    run(runner, "a", 1)
    with pytest.raises(ardiff.BlockOutputError,
                       match=r"frames are 6x6 \(HxW\); earlier blocks of this session were 4x4"):
        run(runner, "a", 1, first_block=1)
    # A new session (here: the same id after a reset) may change size.
    run(runner, "a", 1)
    output = runner.execute(ardiff.RolloutRequest("a", block_index=1, reset=True)).output
    assert tuple(output.frames.shape) == (2, 6, 6, 3)

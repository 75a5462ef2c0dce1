"""The upstream bind and session lifecycle: `bind_ar_diffusion_state` around every forward
(warmup included), the state closed when it exits, a failing bind failing closed, warmup
that never evicts, and the reset hook on every reset."""

from __future__ import annotations

import contextlib

import probe_pipeline as probe
import pytest
from runner_support import HISTORY_PAGES, frame_ids, make_runner, pages_in_use, run

import ardiff
from ardiff.engine.runner import WARMUP_SESSION_ID


def pairs(session_id: str, n: int) -> list[tuple[str, str]]:
    return [("enter", session_id), ("exit", session_id)] * n


def test_the_bind_is_entered_and_exited_once_per_forward():
    runner = make_runner()
    run(runner, "a", 3)
    run(runner, "b", 1)
    assert runner.pipeline.bind_events == pairs("a", 3) + pairs("b", 1)


def test_the_bind_is_entered_and_exited_once_per_warmup_request():
    runner = make_runner(probe.ProbePipeline(warmup_blocks=4))
    runner.warmup()
    assert runner.pipeline.bind_events == pairs(WARMUP_SESSION_ID, 4)


def test_the_bind_exits_once_when_the_forward_raises_and_the_session_fails_closed():
    runner = make_runner(probe.FailingForwardPipeline(fail_at_block=1))
    run(runner, "a", 1)
    with pytest.raises(ardiff.PipelineError, match="generate_block raised"):
        run(runner, "a", 1, first_block=1)
    assert runner.pipeline.bind_events == pairs("a", 2)
    assert runner.pipeline.hook_calls[-1] == ("close", "a") and pages_in_use(runner) == 0
    assert runner.stats().sessions["failed"] == 1


def test_a_state_kept_past_its_bind_is_a_clear_error():
    runner = make_runner()
    run(runner, "a", 1)
    kept = runner.pipeline.last_bound_state
    with pytest.raises(ardiff.KVStateError, match="used after its bind ended"):
        kept.num_committed_frames("main")
    with pytest.raises(ardiff.KVStateError, match="used after its bind ended"):
        with kept.block("main"):
            pass
    assert frame_ids(run(runner, "a", 1, first_block=1)[0]) == [2, 3]  # the session goes on


@pytest.mark.parametrize("where", ["enter", "exit"])
def test_a_bind_that_raises_fails_the_request_closed(where):
    runner = make_runner()
    run(runner, "a", 2)
    runner.pipeline.bind_fault = where
    with pytest.raises(ardiff.PipelineError, match=f"session 'a' block 2: bind_ar_diffusion_state "
                                                   f"raised RuntimeError: injected bind fault on "
                                                   f"{where}"):
        run(runner, "a", 1, first_block=2)
    generated = [call for call in runner.pipeline.hook_calls if call[0] == "generate"]
    assert len(generated) == (2 if where == "enter" else 3)  # enter fails before the forward
    assert runner.pipeline.hook_calls[-1] == ("close", "a")
    assert pages_in_use(runner) == 0 and "a" not in runner.sessions
    assert runner.stats().sessions["failed"] == 1


class NotAContextManager(probe.ProbePipeline):
    def bind_ar_diffusion_state(self, session_id, state):
        return None


def test_a_bind_that_returns_no_context_manager_is_named():
    runner = make_runner(NotAContextManager())
    with pytest.raises(ardiff.PipelineError, match=r"bind_ar_diffusion_state returned a NoneType; "
                                                   r"it must return a context manager \(e\.g\. "
                                                   r"contextlib\.nullcontext\(\)\)"):
        run(runner, "a", 1)
    assert pages_in_use(runner) == 0 and runner.pipeline.hook_calls == [("close", "a")]


# -- warmup ---------------------------------------------------------------------------------
def test_warmup_never_evicts_a_resident_session():
    runner = make_runner(probe.ProbePipeline(warmup_blocks=2), capacity=1)
    run(runner, "a", 2)
    with pytest.raises(ardiff.SessionError, match=r"warmup needs a free session slot and all 1 "
                                                  r"hold sessions; warmup never evicts one"):
        runner.warmup()
    assert runner.sessions.session_ids == ["a"] and pages_in_use(runner) == HISTORY_PAGES
    assert ("close", "a") not in runner.pipeline.hook_calls
    assert runner.stats().sessions["evicted"] == 0
    assert frame_ids(run(runner, "a", 1, first_block=2)[0]) == [4, 5]


def test_warmup_gets_the_reserved_session_id():
    runner = make_runner(probe.ProbePipeline(warmup_blocks=2))
    seen = []
    make = runner.pipeline.ar_diffusion_warmup_requests
    runner.pipeline.ar_diffusion_warmup_requests = lambda sid: seen.append(sid) or make(sid)
    runner.warmup()
    assert seen == [WARMUP_SESSION_ID]


class ForeignWarmupRequests(probe.ProbePipeline):
    def ar_diffusion_warmup_requests(self, session_id):
        yield ardiff.RolloutRequest(session_id, block_index=0)
        yield ardiff.RolloutRequest("someone-else", block_index=1)


def test_a_warmup_request_for_another_session_is_a_clear_error():
    runner = make_runner(ForeignWarmupRequests())
    with pytest.raises(ardiff.WarmupError, match=r"warmup failed: SessionError: a warmup request "
                                                 r"carries session_id 'someone-else'; "
                                                 r"ar_diffusion_warmup_requests\(session_id\) must "
                                                 r"yield requests with the session_id it is given"):
        runner.warmup()
    assert pages_in_use(runner) == 0 and len(runner.sessions) == 0
    assert "someone-else" not in {sid for _, sid in runner.pipeline.hook_calls}


# -- the reset hook: after the KV release, on every reset --------------------------------------
class ResetWitness(probe.ProbePipeline):
    """Records, when its reset hook runs, whether the session still held KV."""

    runner = None

    def reset_ar_diffusion_session(self, session_id):
        self.kv_at_reset = getattr(self, "kv_at_reset", [])
        self.kv_at_reset.append(self.runner.cache.has_session(session_id))
        super().reset_ar_diffusion_session(session_id)


def test_the_reset_hook_runs_after_the_kv_release_on_every_reset():
    pipeline = ResetWitness()
    runner = pipeline.runner = make_runner(pipeline)
    runner.execute(ardiff.RolloutRequest("new", reset=True))       # not resident yet
    run(runner, "a", 2)
    runner.execute(ardiff.RolloutRequest("a", block_index=2, reset=True))   # resident
    runner.close_session("a")
    runner.execute(ardiff.RolloutRequest("a", reset=True))          # closed, then reset
    assert pipeline.kv_at_reset == [False, False, False]
    resets = [sid for hook, sid in pipeline.hook_calls if hook == "reset"]
    assert resets == ["new", "a", "a"]


def test_nullcontext_binds_work_too():
    class Plain(probe.ProbePipeline):
        def bind_ar_diffusion_state(self, session_id, state):
            return contextlib.nullcontext()

    runner = make_runner(Plain())
    assert frame_ids(run(runner, "a", 2)[1]) == [2, 3]


class ExitingCloseHook(probe.ProbePipeline):
    def close_ar_diffusion_session(self, session_id):
        super().close_ar_diffusion_session(session_id)
        raise SystemExit(3)


def test_a_close_hook_that_calls_exit_is_a_failing_hook_and_the_session_still_goes():
    runner = make_runner(ExitingCloseHook())
    run(runner, "a", 2)
    with pytest.raises(ardiff.PipelineError, match=r"releasing session 'a' \(closed\): "
                                                   r"SystemExit: 3"):
        runner.close_session("a")
    assert "a" not in runner.sessions and pages_in_use(runner) == 0


class SwallowingBind(probe.FailingForwardPipeline):
    """A bind whose __exit__ returns True: it swallows what the forward raised."""

    def bind_ar_diffusion_state(self, session_id, state):
        class Swallow:
            def __enter__(self):
                return None

            def __exit__(self, *exc_info):
                return True

        return Swallow()


def test_a_bind_that_swallows_the_forwards_error_is_named_with_the_original_as_cause():
    runner = make_runner(SwallowingBind(fail_at_block=0, fail_stage="commit"))
    with pytest.raises(ardiff.PipelineError, match=r"session 'a' block 0: bind_ar_diffusion_state "
                                                   r"suppressed RuntimeError: injected fault at "
                                                   r"block 0 \(commit\); a bind must let") as info:
        run(runner, "a", 1)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert pages_in_use(runner) == 0 and "a" not in runner.sessions


class InterruptedCloseHook(probe.ProbePipeline):
    def close_ar_diffusion_session(self, session_id):
        raise KeyboardInterrupt


def test_a_ctrl_c_in_a_hook_still_leaves_the_map_and_the_cache_agreeing():
    runner = make_runner(InterruptedCloseHook())
    run(runner, "a", 1)
    with pytest.raises(KeyboardInterrupt):
        runner.close_session("a")
    assert "a" not in runner.sessions and not runner.cache.has_session("a")


def test_a_kv_block_the_forward_never_exits_fails_it_naming_session_and_block():
    from fault_pipelines import FaultPipeline

    runner = make_runner(FaultPipeline(fault="open_block", at_block=1))
    run(runner, "a", 1)
    with pytest.raises(ardiff.PipelineError) as failed:
        run(runner, "a", 1, first_block=1)
    assert str(failed.value) == (
        "session 'a' block 1: generate_block returned with a commit block of branch 'main' "
        "still open (entered, never exited); nothing of it was committed and its KV pages are "
        "back in the pool; enter KV blocks with `with state.block(...)`")
    assert pages_in_use(runner) == 0 and runner.stats().sessions["failed"] == 1
    run(runner, "a", 1)  # the session starts over, its slot free
    assert runner.cache.num_committed_frames("a", "main") == 2

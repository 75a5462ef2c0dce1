"""The file gate (ardiff/rollout/gate.py): another thread takes a rollout's files over only
while the job's thread runs pipeline code, and then keeps them. Threads, no pipeline: the
whole takeover through the CLI is in tests/cli/test_signals.py."""

from __future__ import annotations

import threading

from ardiff.rollout.gate import FileGate

REPORT = object()  # what `finish` returns: the gate hands it on as it is


def test_a_takeover_finds_nothing_unless_the_job_runs_pipeline_code():
    finished = []
    gate = FileGate(lambda: finished.append(1) or REPORT)

    assert gate.take_over(timeout_s=0.01) is None  # the job's thread is between steps
    with gate.files():  # ... or writing: the takeover waits, then gives up
        assert run_in_thread(lambda: gate.take_over(timeout_s=0.05)) is None
    assert list(gate.steps(iter([1, 2]))) == [1, 2]
    assert gate.pipeline_since is None and not gate.taken_over and finished == []


def test_pipeline_code_that_never_returns_can_be_taken_over_and_the_files_stay_taken():
    gate = FileGate(lambda: REPORT)
    with gate.pipeline():
        assert gate.pipeline_since is not None
        assert run_in_thread(lambda: gate.take_over(timeout_s=1)) is REPORT
    assert gate.taken_over
    # the job's thread, should the pipeline return, never touches the files again
    assert not gate._files.acquire(timeout=0.05)


def test_no_takeover_once_the_job_is_done():
    gate = FileGate(lambda: REPORT)
    gate.close()
    with gate.pipeline():  # a stale mark after the end changes nothing
        assert run_in_thread(lambda: gate.take_over(timeout_s=0.05)) is None


def test_each_step_is_pipeline_code_and_the_items_are_not():
    gate = FileGate(lambda: REPORT)
    seen = []

    def steps():
        for item in range(3):
            seen.append(gate.pipeline_since is not None)
            yield item

    for _item in gate.steps(steps()):
        seen.append(gate.pipeline_since is not None)
    assert seen == [True, False] * 3


def run_in_thread(call):
    result = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    return result[0]

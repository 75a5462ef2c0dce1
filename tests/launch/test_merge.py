"""ardiff/launch/merge.py: what a job reports when its ranks end differently (no processes:
the ranks' results are written here; the real ranks are in test_rank_faults.py)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from ardiff.launch.merge import JobOutcome, RankResult, merge, no_sessions, unallocated_kv
from ardiff.rollout.report import STATS_SCHEMA, RolloutReport

FRAMES = 6


def result(rank: int, status: str = "ok", error: str | None = None, exit_code: int = 0,
           signal: str | None = None, peer_lost: bool = False) -> RankResult:
    """Rank `rank` of a two-worker job; an `ok` one rolled out its stream, any other ended
    before it had a report (status, error and exit code only)."""
    report = {"status": status, "error": error, "exit_code": exit_code}
    if status == "ok":
        report = RolloutReport(frames_requested=FRAMES, frames_written=FRAMES, rollout_s=1.0,
                               kv=unallocated_kv("paged"), sessions=no_sessions()).to_dict()
    return {"rank": rank, "replica": rank, "cfg_rank": 0, "writes": True, "pid": 100 + rank,
            "threads": 1, "device": "cpu", "report": report, "block_latencies_s": [],
            "peer_lost": peer_lost, "signal": signal}


def job(*results: RankResult, stop_reason: str | None = None, world: int = 2) -> RolloutReport:
    outcome = JobOutcome(stop_reason=stop_reason)
    for each in results:
        outcome.add_result(each)
    report = RolloutReport(frames_requested=FRAMES * world, kv=unallocated_kv("paged"),
                           sessions=no_sessions(), parallel={
                               "workers": world, "cfg": 1, "world_size": world,
                               "launcher": "spawn", "backend": "gloo"})
    merged = merge(outcome, report, {r: [r] for r in range(world)},
                   [Path(f"v-{r}.npy") for r in range(world)])
    jsonschema.validate(merged.to_dict(), STATS_SCHEMA)
    return merged


def test_a_rank_interrupted_by_a_signal_of_its_own_interrupts_the_job():
    report = job(result(0), result(1, "interrupted", "interrupted by SIGTERM", 130, "SIGTERM"))
    assert (report.status, report.exit_code) == ("interrupted", 130)
    assert report.error == "rank 1: interrupted by SIGTERM"


def test_a_peer_that_lost_the_signalled_rank_is_not_the_cause():
    report = job(result(0, "failed", "a peer of its CFG group left", 1, peer_lost=True),
                 result(1, "interrupted", "interrupted by SIGTERM", 130, "SIGTERM"))
    assert (report.status, report.exit_code) == ("interrupted", 130)
    assert report.error == "rank 1: interrupted by SIGTERM (stopped too: rank 0)"


def test_a_rank_failing_on_its_own_outranks_a_signal_and_the_jobs_stop():
    report = job(result(0, "interrupted", "interrupted by SIGTERM", 130, "SIGTERM"),
                 result(1, "failed", "RankFault: injected", 1), stop_reason="SIGINT")
    assert (report.status, report.exit_code) == ("failed", 1)
    assert report.error == "rank 1: RankFault: injected (stopped too: rank 0)"


def test_the_jobs_own_stop_is_named_without_a_rank():
    report = job(result(0, "interrupted", "interrupted by SIGTERM", 130, "SIGTERM"),
                 result(1, "interrupted", "interrupted by SIGTERM", 130), stop_reason="SIGTERM")
    assert (report.status, report.error) == ("interrupted", "interrupted by SIGTERM")


def test_ranks_that_fail_alike_are_named_once_with_the_errors_exit_code():
    message = "pipeline.args.weights: cannot read 'w.safetensors'"
    report = job(result(1, "failed", message, 2), result(0, "failed", message, 2))
    assert (report.status, report.exit_code) == ("failed", 2)
    assert report.error == f"ranks 0, 1: {message}"


def test_a_job_in_which_no_rank_allocated_its_cache_still_has_complete_stats():
    report = job(result(0, "failed", "could not meet the other ranks", 1),
                 result(1, "interrupted", "interrupted by rank 0 failed", 130))
    data = report.to_dict()
    assert data["kv"] == unallocated_kv("paged") and data["sessions"]["created"] == 0
    assert [r["status"] for r in data["ranks"]] == ["failed", "interrupted"]


def test_a_rank_whose_result_never_came_is_named():
    alone = job(result(0, "failed", "could not meet the other ranks", 1))
    assert alone.error == "rank 0: could not meet the other ranks (no result from rank 1)"
    silent = job(result(0))
    assert (silent.status, silent.exit_code) == ("failed", 1)
    assert silent.error == "rank 1: no result reached rank 0"


def test_a_healthy_job_is_ok():
    report = job(result(0), result(1))
    assert (report.status, report.error, report.exit_code) == ("ok", None, 0)
    assert report.frames_written == report.frames_requested


def test_a_sigterm_in_the_middle_of_a_message_waits_until_it_is_whole():
    """A rank's SIGTERM raises where the rank is, but never inside a message to the parent:
    a half-written message would leave the parent waiting for its rest (the job hung)."""
    import signal

    from ardiff.launch.stop import RankStop
    from ardiff.launch.worker import Outbox, RankSignals

    class HalfwaySignal:
        """A connection whose send is interrupted by SIGTERM between its two writes."""

        def __init__(self) -> None:
            self.written: list[str] = []

        def send(self, message: object) -> None:
            self.written.append("header")
            signal.raise_signal(signal.SIGTERM)
            self.written.append("body")

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    try:
        conn = HalfwaySignal()
        outbox = Outbox(conn)  # type: ignore[arg-type]
        signals = RankSignals(RankStop(), outbox)
        with pytest.raises(KeyboardInterrupt, match="^SIGTERM$"):
            outbox.send("progress", {"frames": 2})
        assert conn.written == ["header", "body"]
        assert signals.received == "SIGTERM" and outbox.deferred is None
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGUSR1, before[1])

"""ardiff/engine/timing.py and the runner's latencies: the host clock on CPU; on CUDA two
events read lazily, so `execute` never waits for the device (tested with fake events: no
GPU here; tests/engine/test_cuda_async.py runs the real ones behind the `cuda` marker)."""

from __future__ import annotations

import pytest
import torch
from runner_support import make_runner

import ardiff
from ardiff.engine import timing


class FakeEvent:
    """A CUDA event stand-in: `elapsed_time` in ms from the order of `record` calls."""

    clock = 0.0
    log: list[str] = []

    def __init__(self, fail: bool = False) -> None:
        self.at, self.fail = None, fail

    def record(self) -> None:
        FakeEvent.clock += 7.0
        self.at = FakeEvent.clock
        FakeEvent.log.append("record")

    def synchronize(self) -> None:
        FakeEvent.log.append("synchronize")
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at - self.at


@pytest.fixture(autouse=True)
def fresh_log():
    FakeEvent.log = []


def test_cpu_latency_is_the_host_clock():
    timer = timing.start_timer(torch.device("cpu"))
    latency = timing.stop_timer(timer)
    assert type(timer) is float and type(latency) is float and latency >= 0
    assert timing.seconds(latency) == latency


def test_device_latency_is_read_when_first_asked_and_kept():
    timer = timing.start_timer(torch.device("cuda"), FakeEvent)
    latency = timing.stop_timer(timer, FakeEvent)
    assert FakeEvent.log == ["record", "record"] and not latency.is_read  # nothing waited
    assert timing.seconds(latency) == pytest.approx(0.007)
    assert latency.seconds == pytest.approx(0.007) and latency.is_read
    assert FakeEvent.log == ["record", "record", "synchronize"]  # one wait, at the first read


def test_an_unreadable_event_reports_the_host_launch_time():
    timer = timing.start_timer(torch.device("cuda"), FakeEvent)
    latency = timing.stop_timer(timer, lambda: FakeEvent(fail=True))
    assert 0 <= latency.seconds < 1  # the host time; the job reports the failure itself


def test_the_runner_never_waits_for_the_device_at_execute():
    runner = make_runner()
    runner.device, runner.event_factory = torch.device("cuda"), FakeEvent  # CPU tensors
    results = [runner.execute(ardiff.RolloutRequest("s", block_index=b)) for b in range(3)]
    assert "synchronize" not in FakeEvent.log and FakeEvent.log.count("record") == 6
    assert not any(result.latency.is_read for result in results)
    assert runner.stats().block_latencies_s == pytest.approx([0.007] * 3)
    assert results[0].latency_s == pytest.approx(0.007)


def test_fail_block_fails_the_session_closed_and_names_it():
    runner = make_runner()
    runner.execute(ardiff.RolloutRequest("s", block_index=0))
    with pytest.raises(ardiff.PipelineError, match=r"^session 's' block 0: generate_block \(on "
                       r"the device; surfaced at a later wait for it\) raised RuntimeError: "
                       r"CUDA error"):
        runner.fail_block("s", 0, RuntimeError("CUDA error: launch failure"))
    assert "s" not in runner.sessions and runner.stats().sessions["failed"] == 1
    assert runner.stats().cache.pages_in_use == 0

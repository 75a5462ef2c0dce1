"""ardiff/rollout/handoff.py in the job: on CUDA a block's frames reach the writer one block
late (a pinned copy waited for after the next block is queued). Here, on CPU, the lag is
forced to 1 (and a fake device event stands in for the copy's), so the job's ordering, its
files and its failure paths are checked without a GPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ardiff.config.run import build_config
from ardiff.errors import PipelineError
from ardiff.rollout import handoff, job
from ardiff.rollout.job import run_rollout
from ardiff.rollout.live import LiveBlocks

SUPPORT = Path(__file__).parents[1] / "support"


def make_config(tmp_path: Path, entry: str = "rollout_pipelines.py:RecordingPipeline",
                args: dict | None = None, **rollout):
    data = {"pipeline": {"entry": f"{SUPPORT / entry}", "args": args or {}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": 9, "prompt": "p", **rollout},
            "output": {"path": str(tmp_path / "out.npy"), "fps": 8}}
    return build_config(data, base_dir=tmp_path)


class FakeDone:
    """The copy's CUDA event: records when it was waited for; fails for one block."""

    def __init__(self, log: list, block_index: int, fail: bool) -> None:
        self.log, self.block_index, self.fail = log, block_index, fail

    def synchronize(self) -> None:
        self.log.append(("wait", self.block_index))
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.fixture
def lagged(monkeypatch):
    """`lagged(fail_at=None)`: the job's handoff with lag 1 and fake copy events; returns the
    log of ("push", block) and ("wait", block) in the order they happened."""
    def install(fail_at: int | None = None) -> list:
        log: list = []

        def stage(event):
            log.append(("push", event.block_index))
            done = FakeDone(log, event.block_index, event.block_index == fail_at)
            return handoff.Staged(event, done)

        monkeypatch.setattr(job, "make_handoff", lambda runner, lag=None: handoff.FrameHandoff(
            1, runner.fail_block, stage))
        return log
    return install


def greys(path: Path) -> list[int]:
    return [int(frame[0, 0, 0]) for frame in np.load(path)]


def test_one_block_late_writes_the_same_frames(tmp_path, lagged):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    now = run_rollout(make_config(tmp_path / "a"))
    log = lagged()
    late = run_rollout(make_config(tmp_path / "b"))
    assert now.status == late.status == "ok" and now.frames_written == late.frames_written == 9
    assert greys(tmp_path / "a" / "out.npy") == greys(tmp_path / "b" / "out.npy")
    assert np.array_equal(np.load(tmp_path / "a" / "out.npy"), np.load(tmp_path / "b" / "out.npy"))
    # block i's frames are waited for only once block i+1 was queued; the last at the end
    assert log == [("push", 0), ("push", 1), ("wait", 0), ("push", 2), ("wait", 1),
                   ("push", 3), ("wait", 2), ("push", 4), ("wait", 3), ("wait", 4)]


def test_a_failed_forward_at_block_k_still_writes_every_block_before_it(tmp_path, lagged):
    log = lagged()
    report = run_rollout(make_config(tmp_path, "probe_pipeline.py:FailingForwardPipeline",
                                     {"fail_at_block": 2}, frames=12))
    assert report.status == "failed" and report.error.startswith(
        "session 'stream-0' block 2: generate_block raised RuntimeError: injected fault")
    assert np.load(tmp_path / "out.npy").shape[0] == 4 == report.frames_written  # blocks 0, 1
    assert ("wait", 1) in log  # block 1 was still queued when block 2 failed: written after
    assert report.sessions["failed"] == 1 and report.kv["pages_in_use"] == 0


def test_a_device_error_at_the_later_wait_fails_the_right_session(tmp_path, lagged):
    log = lagged(fail_at=2)
    report = run_rollout(make_config(tmp_path, frames=12, prompts=["a"]))
    assert (report.status, report.exit_code) == ("failed", 1)
    assert report.error.startswith("session 'stream-0' block 2: generate_block (on the device; "
                                   "surfaced at a later wait for it) raised RuntimeError: CUDA")
    assert isinstance(report.exception, PipelineError)
    assert greys(tmp_path / "out.npy") == [0, 20, 40, 60]  # blocks 0 and 1, nothing after 2
    assert report.frames_written == 4 == report.outputs[0].frames
    assert report.sessions["failed"] == 1 and report.kv["pages_in_use"] == 0
    assert log[-1] == ("wait", 2)  # block 3, queued behind it, is dropped, never waited for


def test_a_stop_drops_the_block_queued_behind_the_last_written(tmp_path, lagged):
    lagged()
    stop = job.RolloutStop()
    events = []

    def on_event(event):
        events.append(event)
        if event.phase == "rollout" and event.frames_written == 4:
            stop.request("SIGTERM")

    report = run_rollout(make_config(tmp_path, frames=12), on_event=on_event, stop=stop)
    assert report.status == "interrupted" and report.error == "interrupted by SIGTERM"
    assert greys(tmp_path / "out.npy") == [0, 20, 40, 60]  # where a CPU run stops too


def test_cpu_frames_are_handed_on_at_once_and_cuda_one_block_late():
    assert handoff.frames_lag(torch.device("cpu")) == 0
    assert handoff.frames_lag(torch.device("cuda", 0)) == 1
    gpu = SimpleNamespace(device=torch.device("cuda"), fail_block=None)
    assert handoff.make_handoff(gpu).lag == 1
    assert handoff.make_handoff(gpu, LiveBlocks.frames_lag).lag == 0  # play: no lag
    event = SimpleNamespace(frames=torch.zeros(2, 4, 4, 3, dtype=torch.uint8))
    staged = handoff.stage_frames(event)
    assert staged.event is event and staged.done is None  # CPU frames: no copy, no wait


def test_a_takeover_gets_the_blocks_already_on_the_host_and_never_waits():
    class Copy:  # a copy's CUDA event that is done, or not yet (a stuck device)
        def __init__(self, done: bool) -> None:
            self.done = done

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            raise AssertionError("finished() must not wait for the device")

    copies = iter([Copy(True), Copy(False), Copy(True)])
    queue = handoff.FrameHandoff(1, fail=None, stage=lambda event: handoff.Staged(
        event, next(copies)))
    for block in range(3):
        queue.push(SimpleNamespace(block_index=block))

    assert [event.block_index for event in queue.finished()] == [0]  # not past block 1's copy

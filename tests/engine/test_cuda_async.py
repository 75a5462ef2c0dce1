"""On a CUDA device: auto dtype is bfloat16, `execute` queues a block without waiting for it,
and the rollout's one-block-late pinned hand-off writes the frames a waiting run writes.
Behind the `cuda` marker; skipped without a GPU (the CPU tests fake the events:
tests/engine/test_timing.py, tests/rollout/test_handoff.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ardiff
from ardiff.config.run import load_config
from ardiff.engine.build import build_runner
from ardiff.engine.timing import DeviceLatency
from ardiff.rollout import handoff
from ardiff.rollout.job import run_rollout

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-dit.yaml"


def tiny(tmp_path: Path, *overrides: str):
    return load_config(TINY, ["runtime.device=cuda", "runtime.memory_budget=64MiB",
                              "rollout.frames=12", f"output.path={tmp_path / 'out.npy'}",
                              *overrides])


def test_auto_dtype_is_bfloat16_and_execute_does_not_wait(tmp_path):
    runner = build_runner(tiny(tmp_path))
    try:
        assert runner.plan.dtype == "bfloat16"
        results = [runner.execute(ardiff.RolloutRequest("s", block_index=b, prompt="p"))
                   for b in range(2)]
        assert all(isinstance(r.latency, DeviceLatency) and not r.latency.is_read
                   for r in results)
        assert all(r.latency_s > 0 for r in results)
    finally:
        runner.close()


def test_pinned_copy_equals_the_device_frames():
    frames = torch.randint(0, 255, (3, 16, 16, 3), dtype=torch.uint8, device="cuda")
    event = handoff.BlockEvent(None, 0, frames, 0.0, 3)
    staged = handoff.stage_frames(event)
    staged.done.synchronize()
    assert staged.event.frames.is_pinned() and torch.equal(staged.event.frames, frames.cpu())


def test_one_block_late_hand_off_writes_what_a_waiting_run_writes(tmp_path, monkeypatch):
    (tmp_path / "late").mkdir(), (tmp_path / "now").mkdir()
    late = run_rollout(tiny(tmp_path / "late"))
    monkeypatch.setattr(handoff, "frames_lag", lambda device: 0)  # wait at every block
    now = run_rollout(tiny(tmp_path / "now"))
    assert late.status == now.status == "ok" and late.frames_written == 12
    assert late.to_dict()["run"]["dtype"] == "bfloat16"
    assert np.array_equal(np.load(tmp_path / "late" / "out.npy"),
                          np.load(tmp_path / "now" / "out.npy"))

"""`python -m ardiff.pipelines.bouncing.train`, the command that made the shipped world-model
weights, run for two steps of each stage on a tiny batch (stage 2 with each remedy): the
losses are finite, the weights change, the stage minutes are recorded, and `is_better`
decides as ardiff/pipelines/bouncing/README.md says. (Writing the package's weights, `ship`,
is not run here.)"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

import pytest
import torch

from ardiff.pipelines.bouncing.training import loop, stages

pytestmark = pytest.mark.usefixtures("restore_threads")


@pytest.mark.parametrize("window, sink, jitter, own", [(5, False, 0.0, 0.0), (7, True, 0.5, 0.5)])
def test_both_stages_train_and_record_their_minutes(caplog, tmp_path, window, sink, jitter, own):
    caplog.set_level(logging.INFO, logger=loop.__name__)
    args = argparse.Namespace(seed=0, batch=4, lr=1e-3, base_steps=2, drift_steps=2,
                              drift_lr=1e-4, drift_seed=7, window=window, sink=sink,
                              jitter=jitter, own=own, out=tmp_path)
    minutes: dict[str, float] = {}
    model = stages.train_base(args, minutes)
    before = [p.detach().clone() for p in model.parameters()]
    stages.train_drift(model, args, minutes)
    assert (model.c.window_frames, model.c.sink_frames) == (window, int(sink))
    assert stages.stage2_pipeline_args(args) == {"window_frames": window, "sink_frames": int(sink)}
    stages.write_record(tmp_path / "drift.safetensors", "drift", minutes["drift"], args)
    record = stages.read_record(tmp_path / "drift.safetensors")
    assert record["stage"] == "drift" and record["args"]["window"] == window
    assert record["args"]["out"] == tmp_path.name and record["train_minutes"] < 5   # no absolute path
    assert stages.read_record(tmp_path / "base.safetensors") is None
    assert set(minutes) == {"teacher_forcing", "drift"}
    assert all(0 < m < 5 for m in minutes.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    losses = [float(line.split("loss")[1].split()[0])
              for line in caplog.messages if "loss" in line]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


BASE = {"sprite_visible_frames": 0.80, "sprite_visible_at_end": 0.56, "balls_kept_96": 0.09,
        "next_frame_mse_sampled": 0.0010, "sprite_position_error_px": 0.11}


@pytest.mark.parametrize("change, ships", [
    ({"balls_kept_96": 0.19}, True),                                   # keeps more balls
    ({"sprite_visible_at_end": 0.59}, False),                          # within noise
    ({"balls_kept_96": 0.30, "sprite_visible_frames": 0.79}, False),   # loses sprite frames
    ({"balls_kept_96": 0.30, "next_frame_mse_sampled": 0.00125}, False),   # > 20% worse MSE
    ({"balls_kept_96": 0.30, "next_frame_mse_sampled": 0.00119}, True),
    ({"balls_kept_96": 0.30, "sprite_position_error_px": 0.14}, False),  # sprite control
])
def test_stage_2_ships_only_when_it_keeps_the_world_better(change, ships):
    assert stages.is_better({**BASE, **change}, BASE) == ships


@pytest.mark.slow  # a fresh interpreter: the module must run as `python -m`
def test_it_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "ardiff.pipelines.bouncing.train", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--drift-steps" in result.stdout and "--sink" in result.stdout

"""`python -m ardiff.pipelines.bouncing.train`, the command that made the shipped world-model
weights, run for two steps of each stage on a tiny batch: both losses are finite, the weights
change, the stage minutes are recorded, and `is_better` decides as
ardiff/pipelines/bouncing/README.md says. (Writing the package's weights, `ship`, is not run
here.)"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

import pytest
import torch

from ardiff.pipelines.bouncing.training import stages


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_both_stages_train_and_record_their_minutes(caplog):
    caplog.set_level(logging.INFO, logger=stages.__name__)
    args = argparse.Namespace(seed=0, batch=4, lr=1e-3, base_steps=2, rollout_steps=2,
                              rollout_lr=1e-4)
    minutes: dict[str, float] = {}
    model = stages.train_base(args, minutes)
    before = [p.detach().clone() for p in model.parameters()]
    stages.train_rollout(model, args, minutes)
    assert set(minutes) == {"teacher_forcing", "self_rollout"}
    assert all(0 < m < 5 for m in minutes.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    losses = [float(line.split("loss")[1].split()[0])
              for line in caplog.messages if "loss" in line]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_self_rollout_ships_only_when_it_keeps_more_balls_at_96():
    base = {"balls_kept_30": 0.29, "balls_kept_96": 0.11}
    assert stages.is_better({"balls_kept_30": 0.29, "balls_kept_96": 0.15}, base)
    assert not stages.is_better({"balls_kept_30": 0.29, "balls_kept_96": 0.12}, base)
    assert not stages.is_better({"balls_kept_30": 0.20, "balls_kept_96": 0.30}, base)


@pytest.mark.slow  # a fresh interpreter: the module must run as `python -m`
def test_it_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "ardiff.pipelines.bouncing.train", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--rollout-steps" in result.stdout

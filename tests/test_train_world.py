"""examples/train_world.py, the script that made the shipped world-model weights, run for
two steps of each stage on a tiny batch: both losses are finite, the weights change, the
stage minutes are recorded, and `is_better` decides as the README says. (Writing the
package's weights, `ship`, is not run here.)"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def train_world():
    sys.path.insert(0, str(EXAMPLES))          # it imports eval_world from its folder
    spec = importlib.util.spec_from_file_location("train_world", EXAMPLES / "train_world.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_both_stages_train_and_record_their_minutes(train_world, capsys):
    args = argparse.Namespace(seed=0, batch=4, lr=1e-3, base_steps=2, rollout_steps=2,
                              rollout_lr=1e-4)
    minutes: dict[str, float] = {}
    model = train_world.train_base(args, minutes)
    before = [p.detach().clone() for p in model.parameters()]
    train_world.train_rollout(model, args, minutes)
    assert set(minutes) == {"teacher_forcing", "self_rollout"}
    assert all(0 < m < 5 for m in minutes.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    losses = [float(line.split("loss")[1].split()[0])
              for line in capsys.readouterr().out.splitlines() if "loss" in line]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_self_rollout_ships_only_when_it_keeps_more_balls_at_96(train_world):
    base = {"balls_kept_30": 0.29, "balls_kept_96": 0.11}
    assert train_world.is_better({"balls_kept_30": 0.29, "balls_kept_96": 0.15}, base)
    assert not train_world.is_better({"balls_kept_30": 0.29, "balls_kept_96": 0.12}, base)
    assert not train_world.is_better({"balls_kept_30": 0.20, "balls_kept_96": 0.30}, base)

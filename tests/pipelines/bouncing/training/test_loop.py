"""The training loop (`training/loop.py`): a stage stopped after a checkpoint and resumed
trains on as if it had never stopped; a checkpoint refuses a run of another length."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ardiff
from ardiff.pipelines.bouncing.training import loop

pytestmark = pytest.mark.usefixtures("one_thread")


class Stop(Exception):
    """The process stopped (Ctrl-C, the machine taken back) right after a checkpoint."""


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batches(model):
    def next_batch(rng, gen):   # both generators drawn from, as the stages' batches are
        x = torch.randn(16, 4, generator=gen) + float(rng.normal())
        return (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
    return next_batch


def stop_at(step: int):
    def on_checkpoint(done: int) -> None:
        if done == step:
            raise Stop
    return on_checkpoint


def test_a_resumed_stage_trains_on_as_if_never_stopped(tmp_path):
    plan = loop.Schedule(steps=6, lr=1e-2, seed=3, checkpoint=tmp_path / "s.ckpt",
                         checkpoint_every=2, resume=True)
    straight = tiny_model()
    loop.train(straight, dataclasses.replace(plan, checkpoint=None), batches(straight))
    first = tiny_model()
    with pytest.raises(Stop):
        loop.train(first, plan, batches(first), stop_at(4))
    assert torch.load(plan.checkpoint, weights_only=False)["step"] == 4
    resumed = tiny_model()     # a fresh process: the weights come from the checkpoint
    seen: list[int] = []
    loop.train(resumed, plan, batches(resumed), seen.append)
    assert seen == [6]
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not any(a.equal(b) for a, b in zip(tiny_model().parameters(),
                                                resumed.parameters()))


def test_ctrl_c_between_steps_keeps_the_steps_done(tmp_path):
    plan = loop.Schedule(steps=5, lr=1e-2, seed=3, checkpoint=tmp_path / "s.ckpt",
                         checkpoint_every=10, resume=True)
    straight = tiny_model()
    loop.train(straight, dataclasses.replace(plan, checkpoint=None), batches(straight))
    first = tiny_model()
    calls = iter(range(100))

    def interrupted(rng, gen):
        if next(calls) == 3:
            raise KeyboardInterrupt
        return batches(first)(rng, gen)

    with pytest.raises(KeyboardInterrupt):
        loop.train(first, plan, interrupted)
    assert torch.load(plan.checkpoint, weights_only=False)["step"] == 3
    resumed = tiny_model()
    loop.train(resumed, plan, batches(resumed))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_without_resume_a_stage_starts_afresh(tmp_path):
    plan = loop.Schedule(steps=2, lr=1e-2, seed=3, checkpoint=tmp_path / "s.ckpt",
                         checkpoint_every=1)
    model = tiny_model()
    loop.train(model, plan, batches(model))
    seen: list[int] = []
    loop.train(tiny_model(), plan, batches(tiny_model()), seen.append)
    assert seen == [1, 2]


def test_a_checkpoint_refuses_a_run_of_another_length(tmp_path):
    plan = loop.Schedule(steps=2, lr=1e-2, seed=3, checkpoint=tmp_path / "s.ckpt", resume=True)
    model = tiny_model()
    loop.train(model, plan, batches(model))
    with pytest.raises(ardiff.ConfigError, match=r"steps: 3 differs from the 2 that s.ckpt "
                                                 r"was made for; resume with 2 or start "
                                                 r"afresh without --resume"):
        loop.train(model, dataclasses.replace(plan, steps=3), batches(model))

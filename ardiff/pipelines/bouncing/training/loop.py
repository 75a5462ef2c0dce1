"""The training loop both stages share, resumable from its checkpoints.

    step 0 ... every `checkpoint_every` steps: checkpoint (model, optimiser, schedule, the
    clip and noise generators, the logged loss, minutes so far) --stop--> `resume=True`
    continues from the last one as if never stopped (same batches, same schedule)

A checkpoint is one file, written beside itself and renamed over the last (a stop while
writing leaves the one before); Ctrl-C (KeyboardInterrupt) within a step checkpoints the steps
done before it (the training command turns SIGTERM into one); the batches after such a stop
may differ from an unstopped run's (the generators moved on). Weights snapshots at the checkpoints are the caller's
(`on_checkpoint`). Progress goes to logging.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import ardiff

log = logging.getLogger(__name__)

WEIGHT_DECAY, BETAS = 0.01, (0.9, 0.98)
FINAL_LR_FRACTION = 0.05    # the cosine schedule ends at 5% of the peak learning rate
MAX_WARMUP_STEPS = 100      # linear warmup: this many steps, or a tenth of a short run
MAX_GRAD_NORM = 1.0
LOSS_EMA = 0.98             # smoothing of the logged loss


@dataclass(frozen=True)
class Schedule:
    """How long and how fast a stage trains, and where it keeps its checkpoint."""

    steps: int
    lr: float
    seed: int
    checkpoint: Path | None = None   # None: no checkpoints (tests, short runs)
    checkpoint_every: int = 250
    resume: bool = False             # continue from `checkpoint` when it exists
    log_every: int = 50


def make_optimizer(model, lr: float, steps: int, warmup: int):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY, betas=BETAS)

    def factor(step: int) -> float:  # linear warmup, cosine down to FINAL_LR_FRACTION
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * cosine

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train(model, plan: Schedule, next_batch,
          on_checkpoint: Callable[[int], None] | None = None) -> float:
    """Train `model` for plan.steps steps: next_batch(rng, gen) -> a loss to minimise.
    Returns the training minutes (those of earlier runs of a resumed stage included).

    Raises `ardiff.ConfigError` when resuming a checkpoint made for another number of steps.
    """
    rng, gen = np.random.default_rng(plan.seed), torch.Generator().manual_seed(plan.seed)
    opt, schedule = make_optimizer(model, plan.lr, plan.steps,
                                   warmup=min(MAX_WARMUP_STEPS, plan.steps // 10))
    first, running, minutes_before = 0, None, 0.0
    if plan.resume and plan.checkpoint is not None and plan.checkpoint.exists():
        first, running, minutes_before = _restore(plan, model, opt, schedule, rng, gen)
        log.info(f"  resumed {plan.checkpoint.name} at step {first}/{plan.steps}")
    start = time.time()

    def minutes() -> float:
        return minutes_before + (time.time() - start) / 60

    done = first
    for step in range(first, plan.steps):
        try:   # the weights are not touched before opt.step()
            loss = next_batch(rng, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        except KeyboardInterrupt:   # stopped within a step: keep every step done before it
            if plan.checkpoint is not None and done > first:
                _save(plan.checkpoint, model, opt, schedule, rng, gen, done, running,
                      minutes(), plan.steps)
            raise
        opt.step()
        schedule.step()
        running = loss.item() if running is None else (
            LOSS_EMA * running + (1 - LOSS_EMA) * loss.item())
        done = step + 1
        if done % plan.log_every == 0 or done == plan.steps:
            log.info(f"  step {done:5d}/{plan.steps}  loss {running:.4f}  "
                     f"lr {schedule.get_last_lr()[0]:.2e}  {minutes():5.1f} min "
                     f"({(time.time() - start) / (done - first):.2f} s/step)")
        if plan.checkpoint is not None and (done % plan.checkpoint_every == 0
                                            or done == plan.steps):
            _save(plan.checkpoint, model, opt, schedule, rng, gen, done, running, minutes(),
                  plan.steps)
            if on_checkpoint is not None:
                on_checkpoint(done)
    return minutes()


def _save(path: Path, model, opt, schedule, rng, gen, step: int, running, minutes: float,
          steps: int) -> None:
    state = {"step": step, "steps": steps, "running": running, "minutes": minutes,
             "model": model.state_dict(), "optimizer": opt.state_dict(),
             "schedule": schedule.state_dict(), "rng": rng.bit_generator.state,
             "gen": gen.get_state()}
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    partial.replace(path)


def _restore(plan: Schedule, model, opt, schedule, rng, gen):
    assert plan.checkpoint is not None
    state = torch.load(plan.checkpoint, weights_only=False)
    if state["steps"] != plan.steps:
        raise ardiff.ConfigError(f"steps: {plan.steps} differs from the {state['steps']} "
                                 f"that {plan.checkpoint.name} was made for; resume with "
                                 f"{state['steps']} or start afresh without --resume")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    rng.bit_generator.state = state["rng"]
    gen.set_state(state["gen"])
    return state["step"], state["running"], state["minutes"]

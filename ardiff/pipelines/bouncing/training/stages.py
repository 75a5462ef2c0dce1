"""The two training stages of the bouncing world model, and shipping the better one.

    stage 1, teacher forcing (`losses.teacher_forcing_loss`): simulated clips; predict the
             clean frame from noised copies that see the clean frames before them
    stage 2, self-rollout (`streams.Streams`, Self-Forcing style): predict the simulator's
             next frame from a window of frames the model generated itself (repairing its
             drift), plus half a batch of teacher forcing
    ship:    evaluate both (`evaluate.py`); stage 2 ships only if `is_better`

Run as `python -m ardiff.pipelines.bouncing.train` (`main`: argv, progress, files); seeded.
Timings and results are in ../README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ardiff.pipelines.bouncing.checkpoint import load_weights, save_weights, shipped_weights
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.model import BouncingDiT
from ardiff.pipelines.bouncing.training import evaluate
from ardiff.pipelines.bouncing.training.losses import (
    CLIP,
    rollout_loss,
    simulated_batch,
    teacher_forcing_loss,
)
from ardiff.pipelines.bouncing.training.streams import ROLLOUT_DEPTH, Streams

log = logging.getLogger(__name__)  # progress; `main` shows it on stdout

COMMAND = "python -m ardiff.pipelines.bouncing.train"
EVALUATION = "python -m ardiff.pipelines.bouncing.evaluate (held-out episodes, runtime path)"
WEIGHT_DECAY, BETAS = 0.01, (0.9, 0.98)
FINAL_LR_FRACTION = 0.05    # the cosine schedule ends at 5% of the peak learning rate
MAX_WARMUP_STEPS = 100      # linear warmup: this many steps, or a tenth of a short run
MAX_GRAD_NORM = 1.0
LOSS_EMA = 0.98             # smoothing of the logged loss
# Stage 2 ships only if it keeps this many more balls at frame 96, losing at most
# this many at frame 30.
MIN_GAIN_96, MAX_LOSS_30 = 0.03, 0.01


def make_optimizer(model, lr: float, steps: int, warmup: int):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY, betas=BETAS)

    def factor(step: int) -> float:  # linear warmup, cosine down to FINAL_LR_FRACTION
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * cosine

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train(model, steps: int, lr: float, seed: int, next_batch, log_every: int = 50) -> float:
    """The loop both stages share: next_batch(rng, gen) -> a loss to minimise. Returns
    the minutes it took."""
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    opt, schedule = make_optimizer(model, lr, steps, warmup=min(MAX_WARMUP_STEPS, steps // 10))
    start, running = time.time(), None
    for step in range(steps):
        loss = next_batch(rng, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        schedule.step()
        running = loss.item() if running is None else (
            LOSS_EMA * running + (1 - LOSS_EMA) * loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            elapsed = time.time() - start
            log.info(f"  step {step + 1:5d}/{steps}  loss {running:.4f}  "
                  f"lr {schedule.get_last_lr()[0]:.2e}  {elapsed / 60:5.1f} min "
                  f"({elapsed / (step + 1):.2f} s/step)")
    return (time.time() - start) / 60


def train_base(args, minutes: dict[str, float]) -> BouncingDiT:
    """Stage 1; its training minutes go to minutes["teacher_forcing"]."""
    torch.manual_seed(args.seed)
    model = BouncingDiT(BouncingConfig())
    log.info(f"stage 1: teacher forcing, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.base_steps} steps of {args.batch} clips x {CLIP} frames")

    def next_batch(rng, gen):
        clean, actions = simulated_batch(rng, args.batch, CLIP)
        return teacher_forcing_loss(model, clean, actions, gen)

    minutes["teacher_forcing"] = train(model.train(), args.base_steps, args.lr, args.seed,
                                       next_batch)
    return model.eval()


def train_rollout(model: BouncingDiT, args, minutes: dict[str, float]) -> BouncingDiT:
    """Stage 2; its training minutes go to minutes["self_rollout"]."""
    log.info(f"stage 2: self-rollout, {args.rollout_steps} steps of {args.batch} streams "
          f"({ROLLOUT_DEPTH[0]}-{ROLLOUT_DEPTH[1] - 1} generated frames each)")
    streams = Streams(model, args.batch, np.random.default_rng([args.seed, 2]))

    def next_batch(rng, gen):  # own-rollout loss plus teacher forcing on half a batch
        history, actions, target = streams.advance(gen)
        clean, clip_actions = simulated_batch(rng, args.batch // 2, CLIP)
        return (rollout_loss(model, history, actions, target, gen)
                + teacher_forcing_loss(model, clean, clip_actions, gen))

    minutes["self_rollout"] = train(model.train(), args.rollout_steps, args.rollout_lr,
                                    args.seed + 2, next_batch)
    return model.eval()


def evaluate_file(path: Path, label: str) -> dict[str, float]:
    """Evaluate weights as shipped (bf16 on disk, float32 at run time)."""
    log.info(f"evaluating {label} ({path})")
    metrics = evaluate.evaluate(str(path))
    log.info(evaluate.report(metrics))
    return metrics


def is_better(tuned: dict[str, float], base: dict[str, float]) -> bool:
    """Keep the self-rollout stage only if it measurably cuts the long-run drift
    (more balls kept at frame 96) without losing balls at frame 30."""
    return (tuned["balls_kept_96"] >= base["balls_kept_96"] + MIN_GAIN_96
            and tuned["balls_kept_30"] >= base["balls_kept_30"] - MAX_LOSS_30)


def ship(args, base_path: Path, tuned_path: Path, minutes: dict[str, float]) -> None:
    """Evaluate both stages, copy the better one to the package with its numbers."""
    numbers = {"teacher_forcing": evaluate_file(base_path, "stage 1"),
               "self_rollout": evaluate_file(tuned_path, "stage 2")}
    keep = "self_rollout" if is_better(numbers["self_rollout"], numbers["teacher_forcing"]) \
        else "teacher_forcing"
    chosen = tuned_path if keep == "self_rollout" else base_path
    if keep == "self_rollout":
        why = "the self-rollout stage kept measurably more balls at frame 96 (is_better)"
    else:
        why = ("the self-rollout stage did not keep measurably more balls at frame 96 "
               "(see is_better), so the teacher-forcing weights ship")
    record = {"shipped": keep, "why": why, "metrics": numbers,
              "evaluation": EVALUATION, "command": COMMAND,
              "train_minutes": {k: round(v, 1) for k, v in minutes.items()},
              "recipe": {k: str(v) for k, v in sorted(vars(args).items()) if k != "out"}}
    shipped = shipped_weights()
    save_weights(load_weights(BouncingConfig(weights=str(chosen))), shipped, numbers[keep])
    shipped.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    log.info(f"shipped the {keep.replace('_', ' ')} weights: {shipped}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Train the bouncing-balls world model that "
                                                 "ships with ardiff (ardiff.pipelines.bouncing).")
    parser.add_argument("--stage", choices=["all", "base", "rollout"], default="all")
    parser.add_argument("--init", type=Path, help="weights to start the rollout stage from")
    parser.add_argument("--out", type=Path, default=Path("world-ckpt"), help="checkpoint folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--base-steps", type=int, default=4500)
    parser.add_argument("--rollout-steps", type=int, default=400)
    parser.add_argument("--rollout-lr", type=float, default=2e-4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    base_path, tuned_path = args.out / "base.safetensors", args.out / "rollout.safetensors"
    minutes: dict[str, float] = {}   # training minutes per stage, for the weights' record
    if args.stage in ("all", "base"):
        save_weights(train_base(args, minutes), base_path)
        log.info(f"wrote {base_path}")
    if args.stage in ("all", "rollout"):
        base_path = args.init or base_path
        model = load_weights(BouncingConfig(weights=str(base_path)))
        save_weights(train_rollout(model, args, minutes), tuned_path)
        log.info(f"wrote {tuned_path}")
        ship(args, base_path, tuned_path, minutes)


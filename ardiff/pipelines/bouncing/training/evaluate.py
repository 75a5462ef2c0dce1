"""The bouncing world model's numbers on held-out simulated episodes (the table in ../README.md).

    next-frame error  MSE of the frame predicted after HISTORY true frames (one step from
                      t = 1, and the sampler), against copying the last true frame
    position error    balls' and sprite's centroids (by colour) in the first generated
                      frames against the simulator's, px (not found: MISSING_PX)
    balls kept        (ball, frame) pairs around frames 30 and 96 whose colour is one blob
                      of about the ball's area (the simulator scores below 1: occlusion)

The rollouts are `ardiff rollout`'s path: the pipeline through ardiff's runner and paged
cache, one session per episode. Run as `python -m ardiff.pipelines.bouncing.evaluate`
(`main`: argv, prints); `evaluate` returns the numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import ardiff
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.checkpoint import load_weights
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.model import (
    BouncingDiT,
    model_to_pixels,
    pixels_to_model,
    sample_next,
)
from ardiff.pipelines.bouncing.training import locator

EVAL_SEED = 10_007        # held out: training draws its worlds from default_rng(seed) streams
EPISODES = 64
FRAMES = 96
HISTORY = 9               # true frames before the predicted one (next-frame error)
POSITION_FRAMES = 8       # generated frames scored for position error
KEPT_AT = (30, 96)        # frame numbers (1-based) whose windows score balls kept
KEPT_FRAMES = 5           # ... over this many frames ending there
KEPT_RANGE = (0.5, 1.5)   # area / true area for a ball to count as kept
KEPT_SPREAD = 1.3         # ... and spread / true spread at most this (one blob, not specks)
MISSING_PX = 8.0          # the position error of an object the locator cannot find
VISIBLE_AREA = 0.8        # a ball counts for position error when this much of it shows
ENTRY = "ardiff.pipelines.bouncing:BouncingWorld"
NOISE_SEED = 1            # the noise of the next-frame clips


def episodes(count: int, frames: int, seed: int = EVAL_SEED):
    """Held-out episodes: world seeds (as the pipeline's request.seed), their initial states,
    random actions [B, frames] and the simulator's frames [B, frames, 3, s, s]."""
    seeds = [seed + i for i in range(count)]
    worlds = [sim.SimState.from_seed(s) for s in seeds]
    state = sim.SimState(*(np.concatenate([getattr(w, name) for w in worlds])
                           for name in ("pos", "vel", "radius", "colour", "alive", "sprite")))
    actions = sim.random_actions(np.random.default_rng([seed, count, frames]), count, frames)
    return seeds, state, actions, sim.simulate(state, actions)[0]


def runtime_rollouts(weights: str | None, seeds: list[int], actions: np.ndarray,
                     **overrides) -> np.ndarray:
    """Each episode through ardiff's runner and paged cache -> [B, F, 3, s, s] in [0, 1];
    `overrides` are pipeline args (BouncingConfig fields)."""
    args = {"weights": weights, **overrides}
    config = ardiff.build_config({"pipeline": {"entry": ENTRY, "args": args},
                                  "runtime": {"device": "cpu", "memory_budget": "64MiB"}})
    runner, upscale = ardiff.build_runner(config), BouncingConfig(**args).upscale
    videos = []
    try:
        for seed, row in zip(seeds, actions):
            frames = [runner.execute(ardiff.RolloutRequest(
                f"episode-{seed}", block_index=f, seed=seed, actions=(sim.ACTIONS[a],),
                close_session=f == len(row) - 1)).output.frames for f, a in enumerate(row)]
            video = torch.cat(frames)[:, ::upscale, ::upscale].permute(0, 3, 1, 2)
            videos.append(video.float().numpy() / 255)
    finally:
        runner.close()
    return np.stack(videos)


@torch.inference_mode()
def next_frame_error(model: BouncingDiT, count: int = 256) -> dict[str, float]:
    """One-step (t = 1) and sampled next-frame MSE after HISTORY true frames (the window
    sees the last 4, whose K/V carry the rest, as in the KV cache), vs copy-last-frame."""
    _, _, actions, frames = episodes(count, HISTORY + 1, EVAL_SEED + 100_000)
    x, a = pixels_to_model(frames), torch.from_numpy(actions)
    noise = torch.randn(x[:, 0].shape, generator=torch.Generator().manual_seed(NOISE_SEED))
    target = frames[:, -1]
    one_step = model_to_pixels(sample_next(model, x[:, :-1], a, 0, noise, 1))
    sampled = model_to_pixels(sample_next(model, x[:, :-1], a, 0, noise, model.c.num_steps))
    return {"next_frame_mse_t1": float(((one_step - target) ** 2).mean()),
            "next_frame_mse_sampled": float(((sampled - target) ** 2).mean()),
            "copy_last_frame_mse": float(((frames[:, -2] - target) ** 2).mean())}


def position_errors(generated: np.ndarray, true: np.ndarray, state: sim.SimState,
                    frames: slice) -> dict[str, float]:
    """Mean centroid distance (px) of balls and sprite, generated vs simulated, over `frames`."""
    gen, ref = generated[:, frames], true[:, frames]
    balls_g, balls_t = locator.locate(gen, state.colour), locator.locate(ref, state.colour)
    full = locator.located_alone(state).area[:, None]                      # [B, 1, balls]
    visible = state.alive[:, None] & (balls_t.area >= VISIBLE_AREA * full)  # not occluded
    ball_dist = np.linalg.norm(balls_g.centre - balls_t.centre, axis=-1)
    ball_dist = np.nan_to_num(ball_dist, nan=MISSING_PX).clip(max=MISSING_PX)
    sprite_dist = np.linalg.norm(locator.locate_sprite(gen).centre
                                 - locator.locate_sprite(ref).centre, axis=-1)
    sprite_dist = np.nan_to_num(sprite_dist, nan=MISSING_PX).clip(max=MISSING_PX)
    return {"ball_position_error_px": float(ball_dist[visible].mean()),
            "sprite_position_error_px": float(sprite_dist.mean())}


def balls_kept(video: np.ndarray, state: sim.SimState, frame_number: int) -> float:
    """Fraction of (ball, frame) pairs over the KEPT_FRAMES ending at `frame_number` (1-based)
    whose pixels of the ball's colour form one blob of about the ball's size."""
    found = locator.locate(video[:, frame_number - KEPT_FRAMES:frame_number], state.colour)
    alone = locator.located_alone(state)
    area = found.area / np.maximum(alone.area, 1)[:, None]
    spread = np.nan_to_num(found.spread, nan=np.inf) / np.maximum(alone.spread, 1e-3)[:, None]
    kept = (area >= KEPT_RANGE[0]) & (area <= KEPT_RANGE[1]) & (spread <= KEPT_SPREAD)
    return float(kept[np.broadcast_to(state.alive[:, None], kept.shape)].mean())


def evaluate(weights: str | None = None, episodes_count: int = EPISODES, clips: int = 256,
             **overrides) -> dict[str, float]:
    """Every number of ../README.md's table for one weights file (None: the shipped weights), the
    pipeline run with args `overrides` (BouncingConfig fields, e.g. num_steps)."""
    config = BouncingConfig(weights=weights, **overrides)
    metrics = {"num_steps": config.num_steps,
               **next_frame_error(load_weights(config).eval(), clips)}
    seeds, state, actions, true = episodes(episodes_count, FRAMES)
    video = runtime_rollouts(weights, seeds, actions, **overrides)
    context = config.context_frames
    metrics.update(position_errors(video, true, state,
                                   slice(context, context + POSITION_FRAMES)))
    for n in KEPT_AT:
        metrics[f"balls_kept_{n}"] = balls_kept(video, state, n)
        metrics[f"sim_balls_kept_{n}"] = balls_kept(true, state, n)
    return metrics


def report(metrics: dict[str, float]) -> str:
    m = metrics
    return "\n".join([
        f"denoising steps per frame        {m['num_steps']}",
        f"next-frame MSE (t=1, one step)   {m['next_frame_mse_t1']:.4f}",
        f"next-frame MSE (4-step sampler)  {m['next_frame_mse_sampled']:.4f}",
        f"copy-last-frame MSE              {m['copy_last_frame_mse']:.4f}",
        f"ball position error, 8 frames    {m['ball_position_error_px']:.2f} px",
        f"sprite position error, 8 frames  {m['sprite_position_error_px']:.2f} px",
        *[f"balls kept at frame {n:<2d}           {m[f'balls_kept_{n}']:.2f}"
          f"  (simulator {m[f'sim_balls_kept_{n}']:.2f})" for n in KEPT_AT]])


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the bouncing world model's numbers.")
    parser.add_argument("--weights", help="a .safetensors file (default: the shipped weights)")
    parser.add_argument("--episodes", type=int, default=EPISODES)
    parser.add_argument("--num-steps", type=int,
                        help="denoising steps per frame (default: the pipeline's, 4)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {} if args.num_steps is None else {"num_steps": args.num_steps}
    metrics = evaluate(args.weights, args.episodes, **overrides)
    print(report(metrics))
    if args.json:
        args.json.write_text(json.dumps(metrics, indent=2) + "\n")


if __name__ == "__main__":
    main()

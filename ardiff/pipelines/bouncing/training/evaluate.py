"""The bouncing world model's numbers (the tables in ../README.md): how well it predicts, and
how well it keeps its world over whole games.

    next-frame error  MSE of the frame predicted after HISTORY true frames (one step from
                      t = 1, and the sampler), against copying the last true frame
    games             WORLDS worlds (seeds 0.., `SimState.from_seed`: what `ardiff rollout` and
                      `ardiff play` start from), each FRAMES frames steered like a player
                      would (`games.player_actions`), scored on the generated frames:
    sprite visible    frames whose white pixels (the locator's) keep at least SPRITE_KEPT of
                      the sprite's area; the share of generated frames, and of games at their
                      last frame. `sprite in place` is stricter: the sprite whole, where the
                      simulator has it (`games.sprite_visible`)
    position error    balls' and sprite's centroids (by colour) in the first generated
                      frames against the simulator's, px (not found: MISSING_PX)
    balls kept        (ball, frame) pairs around frames 30 and 96 whose colour is one blob
                      of about the ball's area (the simulator scores below 1: occlusion)
    long horizon      the share of every 50th frame of 8 games x 2,000 frames that still
                      looks like the world (`horizon.py`)

The games are `ardiff rollout`'s path: the pipeline through ardiff's runner and paged
cache, ROWS sessions per batched forward (equal to one session per forward within the
bounds across kernels, docs/development.md). Run as
`python -m ardiff.pipelines.bouncing.evaluate` (`main`: argv, the report on stdout through
logging); `evaluate` returns the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

import ardiff
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.checkpoint import load_weights, shipped_weights
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.model import (
    BouncingDiT,
    model_to_pixels,
    pixels_to_model,
    sample_next,
)
from ardiff.pipelines.bouncing.training import games, horizon, locator
from ardiff.pipelines.bouncing.training.cli import (
    Parser,
    natural_int,
    positive_int,
    refuse_overwrite,
    run,
    weights_file,
)

log = logging.getLogger(__name__)  # the report; `main` shows it on stdout

EVAL_SEED = 10_007        # held out: the next-frame clips (training draws default_rng(seed))
WORLDS = 64               # games in worlds 0..WORLDS-1 (the default config's world, 5, among them)
FRAMES = 96               # frames per game, the 4 start frames included (6 s at 16 fps)
ROWS = 16                 # sessions per batched forward
HISTORY = 9               # true frames before the predicted one (next-frame error)
POSITION_FRAMES = 8       # generated frames scored for position error
KEPT_AT = (30, 96)        # frame numbers (1-based) whose windows score balls kept
KEPT_FRAMES = 5           # ... over this many frames ending there
KEPT_RANGE = (0.5, 1.5)   # area / true area for a ball to count as kept
KEPT_SPREAD = 1.3         # ... and spread / true spread at most this (one blob, not specks)
SPRITE_KEPT = 0.25        # a frame shows the sprite while this share of its area is white
MISSING_PX = 8.0          # the position error of an object the locator cannot find
VISIBLE_AREA = 0.8        # a ball counts for position error when this much of it shows
ENTRY = "ardiff.pipelines.bouncing:BouncingWorld"
NOISE_SEED = 1            # the noise of the next-frame clips


def episodes(count: int, frames: int, seed: int = EVAL_SEED):
    """Held-out clips: world seeds, their initial states, random actions [B, frames] and the
    simulator's frames [B, frames, 3, s, s] (the next-frame error's)."""
    seeds = [seed + i for i in range(count)]
    actions = sim.random_actions(np.random.default_rng([seed, count, frames]), count, frames)
    return seeds, *simulated(seeds, actions)


def simulated(seeds: list[int], actions: np.ndarray
              ) -> tuple[sim.SimState, np.ndarray, np.ndarray]:
    """The worlds the seeds name (`SimState.from_seed`) as one batch, and their frames under
    actions [B, F]: (state, actions, frames [B, F, 3, s, s])."""
    state = worlds_of(seeds)
    return state, actions, sim.simulate(state, actions)[0]


def worlds_of(seeds: list[int]) -> sim.SimState:
    """The worlds the seeds name (`SimState.from_seed`) as one batch."""
    worlds = [sim.SimState.from_seed(s) for s in seeds]
    return sim.SimState(*(np.concatenate([getattr(w, name) for w in worlds])
                          for name in ("pos", "vel", "radius", "colour", "alive", "sprite")))


def player_games(count: int = WORLDS, frames: int = FRAMES, first: int = 0):
    """The games: worlds first..first+count-1, a player's keys each (`games.player_actions`,
    seeded; a world's keys are the same whichever range holds it): seeds, initial states,
    actions [B, frames] and the simulator's frames."""
    rng = np.random.default_rng(games.ACTIONS_SEED)
    keys = [games.player_actions(rng, frames) for _ in range(first + count)][first:]
    seeds = list(range(first, first + count))
    actions = np.array([[sim.ACTIONS.index(name) for name in game] for game in keys])
    return seeds, *simulated(seeds, actions)


def runtime_rollouts(weights: str | None, seeds: list[int], actions: np.ndarray,
                     rows: int = ROWS, keep: np.ndarray | None = None,
                     **overrides) -> np.ndarray:
    """Each episode through ardiff's runner and paged cache, `rows` sessions per batched
    forward -> [B, F, 3, s, s] in [0, 1] (only the frames `keep` indexes, when given: long
    games); `overrides` are pipeline args (BouncingConfig fields)."""
    kept = set(range(actions.shape[1]) if keep is None else keep.tolist())
    args = {"weights": weights, "session_capacity": rows, **overrides}
    config = ardiff.build_config({"pipeline": {"entry": ENTRY, "args": args},
                                  "runtime": {"device": "cpu", "memory_budget": "64MiB"}})
    runner, upscale = ardiff.build_runner(config, batch_rows=rows), BouncingConfig(**args).upscale
    videos = []
    try:
        for first in range(0, len(seeds), rows):
            group = range(first, min(first + rows, len(seeds)))
            blocks = []
            for f in range(actions.shape[1]):
                results = runner.execute_batch([ardiff.RolloutRequest(
                    f"episode-{seeds[b]}", block_index=f, seed=seeds[b],
                    actions=(sim.ACTIONS[actions[b, f]],), close_session=f == actions.shape[1] - 1)
                    for b in group])
                if f in kept:
                    blocks.append(torch.cat([r.output.frames for r in results]))  # [rows, H, W, 3]
            video = torch.stack(blocks, 1)[:, :, ::upscale, ::upscale].permute(0, 1, 4, 2, 3)
            videos.append(video.float().numpy() / 255)
    finally:
        runner.close()
    return np.concatenate(videos)


def sprite_shown(video: np.ndarray) -> np.ndarray:
    """[B, F] bool: frames [B, F, 3, H, W] in [0, 1] whose white pixels keep at least
    SPRITE_KEPT of the sprite's area (wherever they are)."""
    return locator.locate_sprite(video).area[..., 0] >= SPRITE_KEPT * games.sprite_alone().area[0, 0, 0]


def sprite_numbers(video: np.ndarray, seeds: list[int], actions: np.ndarray,
                   context: int) -> dict[str, float]:
    """The sprite's share of generated frames shown and in place, and of games showing it at
    the last frame; video [B, F, 3, H, W], the first `context` frames the simulator's."""
    keys = [[sim.ACTIONS[a] for a in game] for game in actions]
    shown = sprite_shown(video)
    in_place = games.sprite_visible(video, games.sprite_corners(seeds, keys))
    return {"sprite_visible_frames": float(shown[:, context:].mean()),
            "sprite_visible_at_end": float(shown[:, -1].mean()),
            "sprite_in_place_frames": float(in_place[:, context:].mean()),
            "sprite_in_place_at_end": float(in_place[:, -1].mean())}


@torch.inference_mode()
def next_frame_error(model: BouncingDiT, count: int = 256,
                     context_noise: float = 0.0) -> dict[str, float]:
    """One-step (t = 1) and sampled next-frame MSE after HISTORY true frames (the window
    sees the last ones, whose K/V carry the rest, as in the KV cache; the first is the sink
    where the model has one; noised to `context_noise` as the pipeline commits them), vs
    copy-last-frame."""
    _, state, actions, frames = episodes(count, HISTORY + 1, EVAL_SEED + 100_000)
    x, a = pixels_to_model(frames), torch.from_numpy(actions)
    if model.c.sink_frames:   # the sink frame as the pipeline commits it: the balls alone
        x[:, 0] = pixels_to_model(sim.render(sim.step(state, actions[:, 0]), sprite=False))
    gen = torch.Generator().manual_seed(NOISE_SEED)
    noise = torch.randn(x[:, 0].shape, generator=gen)
    history = x[:, :-1]
    if context_noise:
        history = (1 - context_noise) * history + context_noise * torch.randn(
            history.shape, generator=gen)
    target = frames[:, -1]
    one_step = model_to_pixels(sample_next(model, history, a, 0, noise, 1, context_noise))
    sampled = model_to_pixels(sample_next(model, history, a, 0, noise, model.c.num_steps,
                                          context_noise))
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


def long_horizon(weights: str | None, worlds: int = horizon.HORIZON_WORLDS,
                 frames: int = horizon.HORIZON_FRAMES, **overrides) -> dict[str, float]:
    """The long-horizon share (`horizon.py`) of `worlds` games of `frames` frames (worlds
    0.., a player's keys) through the runtime, and the simulator's."""
    rng = np.random.default_rng(games.ACTIONS_SEED)
    seeds = list(range(worlds))
    actions = np.array([[sim.ACTIONS.index(name) for name in games.player_actions(rng, frames)]
                        for _ in range(worlds)])
    scored = horizon.scored_frames(frames)
    video = runtime_rollouts(weights, seeds, actions, rows=worlds, keep=scored,
                             **{**overrides, "upscale": 1})
    state = worlds_of(seeds)
    world, kept, at = state, [], set(scored.tolist())
    for f in range(frames):   # the simulator's scored frames, without keeping the rest
        world = sim.step(world, actions[:, f])
        if f in at:
            kept.append(sim.render(world))
    true = np.stack(kept, 1)
    areas = locator.located_alone(state).area
    live = [areas[b][state.alive[b]] for b in range(worlds)]

    def share(v: np.ndarray) -> float:
        flat = v.reshape(-1, *v.shape[2:])
        return float(horizon.looks_like_world(flat, [a for a in live for _ in scored],
                                              sprite_shown(v).reshape(-1)).mean())

    return {"horizon_worlds": worlds, "horizon_frames": frames,
            "horizon_share": share(video), "sim_horizon_share": share(true)}


def evaluate(weights: str | None = None, worlds: int = WORLDS, clips: int = 256,
             frames: int = FRAMES, horizon_worlds: int = horizon.HORIZON_WORLDS,
             horizon_frames: int = horizon.HORIZON_FRAMES, first_world: int = 0,
             **overrides) -> dict[str, float]:
    """Every number of ../README.md's tables for one weights file (None: the shipped weights),
    the pipeline run with args `overrides` (BouncingConfig fields, e.g. num_steps);
    `horizon_worlds` 0: without the long-horizon share.

    Raises `ardiff.ConfigError` for games too short to score (`frames`, `horizon_frames`).
    """
    config = BouncingConfig(weights=weights, **overrides)
    check_lengths(config, frames, horizon_worlds, horizon_frames)
    metrics = {"num_steps": config.num_steps, "worlds": worlds, "first_world": first_world,
               "frames": frames,
               **next_frame_error(load_weights(config).eval(), clips, config.context_noise)}
    seeds, state, actions, true = player_games(worlds, frames, first_world)
    video = runtime_rollouts(weights, seeds, actions, **overrides)
    context = config.context_frames
    metrics.update(sprite_numbers(video, seeds, actions, context))
    metrics.update(position_errors(video, true, state,
                                   slice(context, context + POSITION_FRAMES)))
    for n in (n for n in KEPT_AT if n <= frames):
        metrics[f"balls_kept_{n}"] = balls_kept(video, state, n)
        metrics[f"sim_balls_kept_{n}"] = balls_kept(true, state, n)
    if horizon_worlds:
        metrics.update(long_horizon(weights, horizon_worlds, horizon_frames, **overrides))
    return metrics


def check_lengths(config: BouncingConfig, frames: int, horizon_worlds: int,
                  horizon_frames: int) -> None:
    """Raise `ardiff.ConfigError` when the games are too short to score."""
    shortest = config.context_frames + POSITION_FRAMES
    if frames < shortest:
        raise ardiff.ConfigError(f"--frames: {frames} leaves no {POSITION_FRAMES} generated "
                                 f"frames after the {config.context_frames} start frames to "
                                 f"score; use --frames {shortest} or more")
    if horizon_worlds and horizon_frames < horizon.HORIZON_EVERY:
        raise ardiff.ConfigError(f"--horizon-frames: {horizon_frames} has no frame to score "
                                 f"(every {horizon.HORIZON_EVERY}th is); use "
                                 f"{horizon.HORIZON_EVERY} or more, or --horizon-worlds 0")


def report(metrics: dict[str, float]) -> str:
    m = metrics
    return "\n".join([
        f"games                            {m['worlds']} worlds x {m['frames']} frames, "
        f"{m['num_steps']} denoising steps per frame (worlds {m.get('first_world', 0)}-"
        f"{m.get('first_world', 0) + m['worlds'] - 1})",
        f"sprite visible, generated frames {m['sprite_visible_frames']:.2f}",
        f"sprite visible at the last frame {m['sprite_visible_at_end']:.2f}",
        f"sprite in place, generated       {m['sprite_in_place_frames']:.2f}",
        f"sprite in place at the last      {m['sprite_in_place_at_end']:.2f}",
        *[f"balls kept at frame {n:<2d}           {m[f'balls_kept_{n}']:.2f}"
          f"  (simulator {m[f'sim_balls_kept_{n}']:.2f})" for n in KEPT_AT
          if f"balls_kept_{n}" in m],
        f"ball position error, 8 frames    {m['ball_position_error_px']:.2f} px",
        f"sprite position error, 8 frames  {m['sprite_position_error_px']:.2f} px",
        f"next-frame MSE (t=1, one step)   {m['next_frame_mse_t1']:.4f}",
        f"next-frame MSE (sampler)         {m['next_frame_mse_sampled']:.4f}",
        f"copy-last-frame MSE              {m['copy_last_frame_mse']:.4f}",
        *([f"long horizon ({m['horizon_worlds']} x {m['horizon_frames']} frames) "
           f"{m['horizon_share']:.2f}  (simulator {m['sim_horizon_share']:.2f})"]
          if "horizon_share" in m else [])])


def parser() -> Parser:
    p = Parser(prog="python -m ardiff.pipelines.bouncing.evaluate",
               description="Print the bouncing world model's numbers.")
    p.add_argument("--weights", type=weights_file,
                   help="a .safetensors file (default: the shipped weights)")
    p.add_argument("--worlds", type=positive_int, default=WORLDS, help="games, in worlds 0..N-1")
    p.add_argument("--first-world", type=natural_int, default=0,
                   help="games in worlds N..N+worlds-1 (64: held out from choosing on 0-63)")
    p.add_argument("--frames", type=positive_int, default=FRAMES, help="frames per game")
    p.add_argument("--horizon-worlds", type=natural_int, default=horizon.HORIZON_WORLDS,
                   help="long games for the long-horizon share (0: none)")
    p.add_argument("--horizon-frames", type=positive_int, default=horizon.HORIZON_FRAMES,
                   help="frames per long game")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a pipeline arg, e.g. num_steps=1 or window_frames=6")
    p.add_argument("--num-steps", type=positive_int,
                   help="denoising steps per frame (default: the pipeline's, 4)")
    p.add_argument("--json", type=Path, help="also write the numbers here (not --weights)")
    p.add_argument("--threads", type=positive_int, default=2)
    return p


def main() -> None:
    args = parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    torch.set_num_threads(args.threads)
    run(lambda: evaluate_command(args))


def evaluate_command(args: argparse.Namespace) -> None:
    """The numbers `args` ask for, reported through logging (and written to --json)."""
    refuse_overwrite("--json", args.json, [args.weights or shipped_weights()])
    overrides = dict(pipeline_arg(text) for text in args.set)
    if args.num_steps is not None:
        overrides["num_steps"] = args.num_steps
    weights = None if args.weights is None else str(args.weights)
    metrics = evaluate(weights, args.worlds, frames=args.frames, first_world=args.first_world,
                       horizon_worlds=args.horizon_worlds, horizon_frames=args.horizon_frames,
                       **overrides)
    log.info(report(metrics))
    if args.json:
        args.json.write_text(json.dumps(metrics, indent=2) + "\n")


def pipeline_arg(text: str) -> tuple[str, object]:
    """'FIELD=VALUE' -> (field, value), the value read as YAML (numbers stay numbers)."""
    import yaml

    field, sep, value = text.partition("=")
    if not sep or field not in BouncingConfig.__dataclass_fields__:
        raise ardiff.ConfigError(f"--set: {text!r} is not FIELD=VALUE with a pipeline arg as "
                                 f"FIELD; use one of "
                                 f"{', '.join(BouncingConfig.__dataclass_fields__)}")
    return field, yaml.safe_load(value)


if __name__ == "__main__":
    main()

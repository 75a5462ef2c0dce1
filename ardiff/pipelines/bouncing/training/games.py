"""Is the first game playable: how long the steered sprite lasts in games as `ardiff play` runs them.

    sprite visible   a frame shows the steered sprite when the white pixels (the locator's)
                     within SPRITE_WINDOW_PX of where the simulator has it form one blob of
                     about its area; every simulator frame does
    games            GAMES seeds of the embedded default config (what `ardiff play` plays),
                     each steered like a player would: a direction held 2-8 frames, then
                     1-8 idle frames, for GAME_FRAMES frames

A game is run as the recording of a played game replays (`ardiff rollout --actions LOG`,
frame for frame what `ardiff play` made): `run_rollout` on the default config with the
actions as `rollout.actions`, one process, one game after another. Run as
`python -m ardiff.pipelines.bouncing.training.games` (`main`: argv, the report on stdout
through logging); `playability` returns the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

import ardiff
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.config import BouncingConfig
from ardiff.pipelines.bouncing.training import locator
from ardiff.pipelines.bouncing.training.cli import Parser, natural_int, positive_int, run

log = logging.getLogger(__name__)  # the report; `main` shows it on stdout

GAMES = 32
GAME_FRAMES = 96           # 6 s at 16 fps
HOLD_FRAMES = (2, 8)       # a direction key held this long (inclusive) ...
IDLE_FRAMES = (1, 8)       # ... then released this long
DIRECTIONS = ("left", "right", "up", "down")
IDLE = "none"
ACTIONS_SEED = 2_026       # the players' keys; the worlds are seeds 0..GAMES-1
EARLY_FRAMES = 32          # 2 s: a sprite lost by then spoils the game at once
SPRITE_WINDOW_PX = 3       # white pixels this near the simulator's sprite count for it
VISIBLE_AREA = (0.5, 1.5)  # ... their count / the sprite's area, for the sprite to show
VISIBLE_SPREAD = 1.3       # ... and their spread / the sprite's at most this (one blob)


def player_actions(rng: np.random.Generator, frames: int) -> list[str]:
    """One game's actions, one per frame: a direction held HOLD_FRAMES, idle IDLE_FRAMES."""
    actions: list[str] = []
    while len(actions) < frames:
        actions += [DIRECTIONS[rng.integers(len(DIRECTIONS))]] * int(rng.integers(
            HOLD_FRAMES[0], HOLD_FRAMES[1] + 1))
        actions += [IDLE] * int(rng.integers(IDLE_FRAMES[0], IDLE_FRAMES[1] + 1))
    return actions[:frames]


def sprite_alone() -> locator.Located:
    """What the locator measures for the sprite drawn alone: area and spread [1, 1, 1]."""
    world = sim.SimState.sample(np.random.default_rng(0), 1)
    no_balls = replace(world, alive=np.zeros_like(world.alive))
    return locator.locate_sprite(sim.render(no_balls)[:, None])


def sprite_corners(seeds: list[int], actions: list[list[str]]) -> np.ndarray:
    """[B, F, 2]: where the simulator has each game's sprite (top-left x, y) in each frame."""
    corners = []
    for seed, game in zip(seeds, actions):
        world, path = sim.SimState.from_seed(seed), []
        for name in game:
            world = sim.step(world, np.array([sim.ACTIONS.index(name)]))
            path.append(world.sprite[0])
        corners.append(path)
    return np.array(corners)


def sprite_visible(frames: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """[B, F] bool: frames [B, F, 3, H, W] in [0, 1] that show the sprite whole near its
    `corners` [B, F, 2] (top-left x, y: `sprite_corners`)."""
    low, high = corners - SPRITE_WINDOW_PX, corners + sim.SPRITE_SIDE + SPRITE_WINDOW_PX
    centres = sim.PIXEL_CENTRES
    cols = (centres >= low[..., :1]) & (centres < high[..., :1])        # [B, F, W]
    rows = (centres >= low[..., 1:]) & (centres < high[..., 1:])        # [B, F, H]
    near = frames * (rows[..., :, None] & cols[..., None, :])[:, :, None]
    found, alone = locator.locate_sprite(near), sprite_alone()
    area = found.area[..., 0] / alone.area[0, 0, 0]
    spread = np.nan_to_num(found.spread[..., 0], nan=np.inf) / alone.spread[0, 0, 0]
    return (area >= VISIBLE_AREA[0]) & (area <= VISIBLE_AREA[1]) & (spread <= VISIBLE_SPREAD)


def play_games(seeds: list[int], actions: list[list[str]], overrides: list[str] = ()
               ) -> np.ndarray:
    """Each game through `run_rollout` on the embedded default config, `overrides` (`--set`
    strings) applied -> the recorded frames [B, F, 3, 32, 32] in [0, 1]."""
    videos = []
    with tempfile.TemporaryDirectory(prefix="ardiff-games-") as folder:
        for seed, game in zip(seeds, actions):
            path = Path(folder) / f"game-{seed}.npy"
            config = ardiff.load_config(None, [
                *overrides, f"rollout.seed={seed}", f"rollout.frames={len(game)}",
                f"rollout.actions={json.dumps(game)}", f"output.path={json.dumps(str(path))}",
                "output.scale=1"])   # the model's 32x32 frames, as the player sees them enlarged
            report = ardiff.run_rollout(config)
            if report.status != "ok":
                raise ardiff.RunError(f"game {seed}: {report.error}")
            videos.append(np.load(path).transpose(0, 3, 1, 2).astype(np.float32) / 255)
    return np.stack(videos)


def playability(games: int = GAMES, frames: int = GAME_FRAMES, overrides: list[str] = (),
                world: int | None = None) -> dict[str, float]:
    """The share of generated frames that show the sprite, of games that show it at their
    last frame, that lose it (a frame without it) within EARLY_FRAMES, and that never do.
    The games are in worlds 0..games-1, or all in `world` (each with its own keys)."""
    rng = np.random.default_rng(ACTIONS_SEED)
    seeds = list(range(games)) if world is None else [world] * games
    actions = [player_actions(rng, frames) for _ in seeds]
    video = play_games(seeds, actions, overrides)
    args = ardiff.load_config(None, list(overrides)).pipeline.args
    context = BouncingConfig(**args).context_frames
    visible = sprite_visible(video, sprite_corners(seeds, actions))
    generated = visible[:, context:]       # the start frames are the simulator's
    return {"games": games, "frames": frames, "world": world,
            "sprite_visible_frames": float(generated.mean()),
            "sprite_visible_at_end": float(visible[:, -1].mean()),
            "games_losing_it_early": float((~visible[:, :EARLY_FRAMES]).any(axis=1).mean()),
            "games_never_losing_it": float(generated.all(axis=1).mean())}


def report(metrics: dict[str, float]) -> str:
    m = metrics
    return "\n".join([
        f"games, frames each                    {m['games']} x {m['frames']} in "
        + (f"worlds 0..{m['games'] - 1}" if m["world"] is None else f"world {m['world']}"),
        f"generated frames showing the sprite   {m['sprite_visible_frames']:.2f}",
        f"games showing it at frame {m['frames']:<3d}         {m['sprite_visible_at_end']:.2f}",
        f"games losing it within {EARLY_FRAMES} frames      {m['games_losing_it_early']:.2f}",
        f"games never losing it                 {m['games_never_losing_it']:.2f}"])


def parser() -> Parser:
    parser = Parser(prog="python -m ardiff.pipelines.bouncing.training.games",
                    description="How long the steered sprite lasts in games of the embedded "
                                "default config.")
    parser.add_argument("--games", type=positive_int, default=GAMES)
    parser.add_argument("--frames", type=positive_int, default=GAME_FRAMES)
    parser.add_argument("--world", type=natural_int, help="play every game in this world (a seed)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as `ardiff play --set` takes it")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    return parser


def main() -> None:
    args = parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    run(lambda: play_and_report(args))


def play_and_report(args: argparse.Namespace) -> None:
    metrics = playability(args.games, args.frames, args.set, args.world)
    log.info(report(metrics))
    if args.json:
        args.json.write_text(json.dumps(metrics, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Does the default video hold? Its world and scripted actions, checked the way a user sees them.

    held      every frame shows the sprite (white pixels keep SPRITE_KEPT of its area) and
              every live ball's pixels stay within AREA_FACTOR of the simulator's for that
              ball in that frame (frames where the simulator shows under SHOWN_AREA of the
              ball, hidden behind the sprite or another ball, are not scored)
    runs      the video as `ardiff rollout` makes it; PERTURBED_RUNS more with the first start
              frame's pixels moved by +-1 level (8-bit), one noise pattern per run
    verdict   a candidate holds when every plain run holds and at least PERTURBED_NEEDED of
              the perturbed runs do

`python -m ardiff.pipelines.bouncing.training.default_video` checks the shipped default (or
`--seed`/`--actions`, or `--search N` worlds with the scripts below) on this machine's
kernels; `--kernels` runs the plain video again under each `ATEN_CPU_CAPABILITY` this CPU
supports, with 1 and 2 threads, through the `ardiff` command itself. Why a world was chosen:
../README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import ardiff
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.pipeline import BouncingWorld
from ardiff.pipelines.bouncing.training import games, locator

log = logging.getLogger(__name__)  # the report; `main` shows it on stdout

SPRITE_KEPT = 0.25        # share of the sprite's area that must stay white (evaluate.py's)
AREA_FACTOR = 1.5         # a ball's area stays within [1/1.5, 1.5] x the simulator's
SHOWN_AREA = 0.5          # ... scored where the simulator shows this share of it alone
PERTURBED_RUNS = 16
PERTURBED_NEEDED = 15
LEVEL = 1 / 255           # one 8-bit level, in the simulator's [0, 1] pixels
KERNELS = ("default", "avx2", "avx512")
THREADS = (1, 2)
PERTURB_KEY = "first_frame_noise_seed"   # RolloutRequest.extra: which +-1 pattern
CLI = "from ardiff_cli.main import main; main()"  # the `ardiff` script, in a fresh process


def default_run() -> tuple[int, list[str], int]:
    """The shipped default config's world seed, its action script and its frame count."""
    rollout = ardiff.load_config(None).rollout
    return rollout.seed, list(rollout.actions), rollout.frames


@dataclass(frozen=True)
class Verdict:
    """One candidate's runs: which plain and perturbed runs held, and the worst numbers."""

    plain_held: list[bool]
    perturbed_held: list[bool]
    worst_sprite: float       # lowest share of the sprite's area shown, any run, any frame
    worst_ball: float         # largest |log(area / simulator's)| / log(AREA_FACTOR), any run

    @property
    def holds(self) -> bool:
        return all(self.plain_held) and sum(self.perturbed_held) >= PERTURBED_NEEDED


def held(video: np.ndarray, seed: int, actions: list[str]) -> tuple[bool, float, float]:
    """Score one video [F, 3, S, S] in [0, 1] of world `seed` under `actions` (one a frame,
    the list repeating as `rollout.actions` does):
    (held, the lowest sprite share shown, the worst ball-area excursion, 1.0 at the bound)."""
    state = sim.SimState.from_seed(seed)
    codes = np.array([[sim.ACTIONS.index(actions[f % len(actions)]) for f in range(len(video))]])
    true = sim.simulate(state, codes)[0]                                  # [1, F, 3, S, S]
    sprite = locator.locate_sprite(video[None]).area[0, :, 0] / games.sprite_alone().area[0, 0, 0]
    generated = locator.locate(video[None], state.colour).area[0]         # [F, balls]
    shown = locator.locate(true, state.colour).area[0]
    alone = locator.located_alone(state).area[0]                          # [balls]
    scored = state.alive[0][None] & (shown >= SHOWN_AREA * np.maximum(alone, 1)[None])
    with np.errstate(divide="ignore"):
        excursion = np.abs(np.log(generated / np.maximum(shown, 1))) / np.log(AREA_FACTOR)
    worst_ball = float(excursion[scored].max()) if scored.any() else 0.0
    worst_sprite = float(sprite.min())
    return worst_sprite >= SPRITE_KEPT and worst_ball <= 1.0, worst_sprite, worst_ball


class PerturbedWorld(BouncingWorld):
    """The bouncing pipeline, its first start frame moved by +-1 level per pixel where the
    request asks (`extra[PERTURB_KEY]`: the pattern's seed). For this check only."""

    def _start_frame(self, request, frame: int, action: int):
        shown, kept = super()._start_frame(request, frame, action)
        seed = request.extra.get(PERTURB_KEY)
        if frame != 0 or seed is None:
            return shown, kept
        signs = torch.randint(0, 2, shown.shape, generator=torch.Generator().manual_seed(seed))
        noise = (signs * 2 - 1).to(shown) * LEVEL * 2         # model pixels span [-1, 1]
        return (shown + noise).clamp(-1, 1), (kept + noise).clamp(-1, 1)


def perturbed_videos(seed: int, actions: list[str], frames: int,
                     runs: int = PERTURBED_RUNS) -> np.ndarray:
    """`runs` videos of world `seed`, each with its own +-1-level first frame, advanced
    together in one batched forward per frame -> [runs, F, 3, S, S] in [0, 1]."""
    return batched_videos([(seed, actions, run) for run in range(runs)], frames)


def batched_videos(rows: list[tuple[int, list[str], int | None]], frames: int,
                   batch: int = 64, **pipeline_args) -> np.ndarray:
    """One video per row (world seed, action script, +-1 pattern seed or None for the
    plain start), `batch` rows per batched forward -> [rows, F, 3, S, S] in [0, 1];
    `pipeline_args` override the pipeline's (BouncingConfig fields, e.g. num_steps)."""
    entry = f"{__name__}:PerturbedWorld"
    batch = min(batch, len(rows))
    config = ardiff.build_config({"pipeline": {"entry": entry,
                                               "args": {**pipeline_args, "upscale": 1,
                                                        "session_capacity": batch}},
                                  "runtime": {"device": "cpu", "memory_budget": "256MiB"}})
    runner = ardiff.build_runner(config, batch_rows=batch)
    videos = []
    try:
        for first in range(0, len(rows), batch):
            group = list(enumerate(rows))[first:first + batch]
            blocks = []
            for f in range(frames):
                results = runner.execute_batch([ardiff.RolloutRequest(
                    f"run-{i}", block_index=f, seed=seed, actions=(script[f % len(script)],),
                    close_session=f == frames - 1,
                    extra={} if pattern is None else {PERTURB_KEY: pattern})
                    for i, (seed, script, pattern) in group])
                blocks.append(torch.cat([r.output.frames for r in results]))  # [rows, S, S, 3]
            videos.append(torch.stack(blocks, 1).permute(0, 1, 4, 2, 3).float().numpy() / 255)
    finally:
        runner.close()
    return np.concatenate(videos)


def plain_video(seed: int, actions: list[str], frames: int, kernel: str | None = None,
                threads: int = 1) -> np.ndarray:
    """The video `ardiff rollout` writes for this world and script (as .npy, lossless),
    run as a separate process under `ATEN_CPU_CAPABILITY=kernel` -> [F, 3, S, S] in [0, 1]."""
    env = dict(os.environ)
    if kernel is not None:
        env["ATEN_CPU_CAPABILITY"] = kernel
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "video.npy"
        command = [sys.executable, "-c", CLI, "rollout", "-o", str(out),
                   "--quiet", "--set", f"rollout.seed={seed}", "--set",
                   f"rollout.frames={frames}", "--set", f"rollout.actions={json.dumps(actions)}",
                   "--set", "output.scale=1", "--set", f"pipeline.args.cpu_threads={threads}"]
        # cwd: `python -c` puts the working directory first on sys.path, where a source
        # checkout's ardiff would shadow the installed one.
        subprocess.run(command, env=env, check=True, cwd=folder)
        return np.load(out).transpose(0, 3, 1, 2).astype(np.float32) / 255


def supported_kernels() -> list[str]:
    """The `ATEN_CPU_CAPABILITY` values this CPU can run (torch falls back silently above)."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    order = ["default", "avx2", "avx512"]
    return order[:order.index(best) + 1] if best in order else ["default"]


def check(seed: int, actions: list[str], frames: int, kernels: bool = False) -> Verdict:
    """Every run of one candidate: the plain video in this process's kernels (and, with
    `kernels`, under each supported capability and thread count), and the perturbed runs."""
    plain = [plain_video(seed, actions, frames)] if not kernels else [
        plain_video(seed, actions, frames, kernel, threads)
        for kernel in supported_kernels() for threads in THREADS]
    perturbed = perturbed_videos(seed, actions, frames)
    scores_plain = [held(v, seed, actions) for v in plain]
    scores_perturbed = [held(v, seed, actions) for v in perturbed]
    every = scores_plain + scores_perturbed
    return Verdict([s[0] for s in scores_plain], [s[0] for s in scores_perturbed],
                   min(s[1] for s in every), max(s[2] for s in every))


def square(side: int, pause: int = 0) -> list[str]:
    """The sprite around a square: `side` frames each way, `pause` frames still after each."""
    return [a for move in ("left", "down", "right", "up") for a in [move] * side + ["none"] * pause]


# The scripts a search tries, by name: still, small squares with rests, sweeps.
SCRIPTS = {"still": ["none"], "square-2-rest-4": square(2, 4), "square-4": square(4),
           "sweep-left-right-8": ["left"] * 8 + ["right"] * 8,
           "sweep-up-down-8": ["up"] * 8 + ["down"] * 8}


def search(worlds: range, frames: int) -> list[tuple[int, str, int]]:
    """Screen every one-ball world of `worlds` under every script of SCRIPTS by its plain
    video, then run the perturbed runs of those that held: (world, script, perturbed runs
    held) for each that held plain, best first."""
    one_ball = [w for w in worlds if int(sim.SimState.from_seed(w).alive.sum()) == 1]
    candidates = [(w, name) for w in one_ball for name in SCRIPTS]
    videos = batched_videos([(w, SCRIPTS[name], None) for w, name in candidates], frames)
    passed = [c for c, v in zip(candidates, videos) if held(v, c[0], SCRIPTS[c[1]])[0]]
    log.info("%d one-ball worlds x %d scripts: %d held plain", len(one_ball), len(SCRIPTS),
             len(passed))
    found = []
    for world, name in passed:
        runs = perturbed_videos(world, SCRIPTS[name], frames)
        found.append((world, name, sum(held(v, world, SCRIPTS[name])[0] for v in runs)))
    return sorted(found, key=lambda item: -item[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check that the default video holds (or "
                                                 "search for a world and script that do).")
    parser.add_argument("--seed", type=int, help="the world (default: the default config's)")
    parser.add_argument("--actions", help="comma-separated actions, or a script name: "
                                          + ", ".join(SCRIPTS))
    parser.add_argument("--kernels", action="store_true",
                        help="the plain video under every ATEN_CPU_CAPABILITY and 1, 2 threads")
    parser.add_argument("--search", type=int, metavar="N", help="search worlds 0..N-1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    seed, actions, frames = default_run()
    if args.search is not None:
        for world, name, runs in search(range(args.search), frames):
            log.info("world %d, %s: %d of %d perturbed runs held", world, name, runs,
                     PERTURBED_RUNS)
        return 0
    if args.seed is not None:
        seed = args.seed
    if args.actions:
        actions = SCRIPTS.get(args.actions) or args.actions.split(",")
        unknown = sorted(set(actions) - set(sim.ACTIONS))
        if unknown:
            parser.error(f"--actions: {unknown} are not actions; use {', '.join(sim.ACTIONS)}")
    verdict = check(seed, actions, frames, kernels=args.kernels)
    log.info("world %d, %d frames: plain runs held %d of %d, perturbed %d of %d "
             "(lowest sprite share %.2f, worst ball area %.2fx of the bound): %s", seed, frames,
             sum(verdict.plain_held), len(verdict.plain_held), sum(verdict.perturbed_held),
             len(verdict.perturbed_held), verdict.worst_sprite, verdict.worst_ball,
             "holds" if verdict.holds else "does NOT hold")
    return 0 if verdict.holds else 1


if __name__ == "__main__":
    raise SystemExit(main())

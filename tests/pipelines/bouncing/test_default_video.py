"""The default video, as `ardiff rollout` makes it on this machine, keeps its sprite and its
balls (`training/default_video.py`); its scoring on simulated frames; and (heavy) the
choice of world holding under every kernel path, thread count and a +-1-level first frame."""

from __future__ import annotations

import numpy as np
import pytest

from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.training import default_video


def simulated(seed: int, actions: list[str], frames: int) -> np.ndarray:
    """The simulator's own video of the run: [F, 3, S, S] in [0, 1]."""
    codes = np.array([[sim.ACTIONS.index(actions[f % len(actions)]) for f in range(frames)]])
    return sim.simulate(sim.SimState.from_seed(seed), codes)[0][0]


def test_the_default_video_keeps_its_sprite_and_balls(ardiff_main, tmp_path):
    seed, actions, frames = default_video.default_run()
    out = tmp_path / "default.npy"
    result = ardiff_main("rollout", "-o", out, "--quiet", "--set", "output.scale=1")
    assert result.exit_code == 0, result.output
    video = np.load(out).transpose(0, 3, 1, 2).astype(np.float32) / 255
    assert video.shape == (frames, 3, sim.SIZE, sim.SIZE)
    ok, sprite, ball = default_video.held(video, seed, actions)
    assert ok, (f"world {seed}: the sprite's lowest share {sprite:.2f} (needs "
                f"{default_video.SPRITE_KEPT}), a ball's area {ball:.2f}x of the 1.5x bound")


def test_the_simulator_holds_and_a_lost_sprite_or_swollen_ball_does_not():
    seed, actions, frames = 5, default_video.SCRIPTS["square-4"], 40
    video = simulated(seed, actions, frames)
    assert default_video.held(video, seed, actions)[0]

    no_sprite = video.copy()
    white = (no_sprite > 0.9).all(axis=1)                      # [F, S, S]: the sprite's pixels
    no_sprite[30][:, white[30]] = 0.0
    assert not default_video.held(no_sprite, seed, actions)[0]

    swollen = video.copy()
    colour = sim.SimState.from_seed(seed).colour[0][sim.SimState.from_seed(seed).alive[0]][0]
    swollen[20, :, 2:20, 2:20] = colour[:, None, None]         # a blob of the ball's colour
    ok, _, ball = default_video.held(swollen, seed, actions)
    assert not ok and ball > 1.0


@pytest.mark.heavy
def test_the_default_world_holds_under_every_kernel_path_and_thread_count():
    """The plain video as `ardiff rollout` makes it, under each ATEN_CPU_CAPABILITY this CPU
    has, with 1 and 2 threads."""
    seed, actions, frames = default_video.default_run()
    for kernel in default_video.supported_kernels():
        for threads in default_video.THREADS:
            video = default_video.plain_video(seed, actions, frames, kernel, threads)
            ok, sprite, ball = default_video.held(video, seed, actions)
            assert ok, (kernel, threads, sprite, ball)


@pytest.mark.heavy
@pytest.mark.xfail(strict=True, reason="target not met with today's weights: world 140 holds "
                   "6 of 16 perturbed runs (needs 15; ardiff/pipelines/bouncing/README.md#the-"
                   "default-world); strict: passing means new weights, so update the docs")
def test_the_default_world_holds_with_its_first_frame_moved_one_level():
    seed, actions, frames = default_video.default_run()
    runs = default_video.perturbed_videos(seed, actions, frames)
    held = sum(default_video.held(video, seed, actions)[0] for video in runs)
    assert held >= default_video.PERTURBED_NEEDED, f"{held} of {len(runs)} held"

"""What `output.scale` saves: the default model's video path, old against new, paired.

    python benchmarks/scale_paired.py [--pairs 8]

The default model's first 32 frames at 32x32 (its real output: start frames, then
sampled ones) are written to a 256x256 mp4 while a model-like loop runs on the main
thread (MODEL_MS of thread CPU per frame in 256x256 matmuls, which evict the caches as
a model does). Alternating per run (ABBA):

    old  the x8 upscale in torch on the model thread, 256x256 RGB frames to the writer
         (what `pipeline.args.upscale: 8` did)
    new  32x32 frames to the writer, `scale=8`: YUV 4:4:4 at 32x32, planes repeated

Printed: the video path's CPU per frame (process CPU minus the model loop's: the
upscale, the copy into the queue, the encoder thread), the paired new/old ratio, and
the file's bytes per frame. A script, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import ardiff
from ardiff.config.run import load_config
from ardiff.video.writer import VideoWriter

FRAMES, SCALE, MODEL_MS = 32, 8, 15.0


def model_frames() -> torch.Tensor:
    """The default config's first FRAMES frames at model size, uint8 [F, 32, 32, 3]."""
    config = load_config(None, ["pipeline.args.upscale=1"])
    runner = ardiff.build_runner(config)
    actions = config.rollout.actions
    try:
        return torch.cat([runner.execute(ardiff.RolloutRequest(
            "s", block_index=i, seed=config.rollout.seed,
            actions=(actions[i % len(actions)],))).output.frames for i in range(FRAMES)])
    finally:
        runner.close()


def model_work(ms: float) -> float:
    """Burn `ms` of thread CPU the way a model does (matmuls); returns the process CPU spent."""
    start, thread = time.process_time(), time.thread_time()
    x = np.random.default_rng(0).random((256, 256))
    while time.thread_time() - thread < ms / 1e3:
        x = x @ x.T * 1e-3
    return time.process_time() - start


def run(frames: torch.Tensor, new: bool) -> tuple[float, float]:
    """(video CPU ms per frame, bytes per frame) of one mp4."""
    with tempfile.TemporaryDirectory() as tmp:
        start, model = time.process_time(), 0.0
        with VideoWriter(Path(tmp) / "v.mp4", 16, scale=SCALE if new else 1) as writer:
            for frame in frames:
                model += model_work(MODEL_MS)
                block = frame[None]
                if not new:
                    block = block.repeat_interleave(SCALE, 1).repeat_interleave(SCALE, 2)
                writer.write(block.contiguous())
        spent = time.process_time() - start - model
    return spent * 1e3 / len(frames), writer.info.bytes / len(frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    pairs = parser.parse_args().pairs
    torch.set_num_threads(1)
    frames = model_frames()
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for index in range(pairs):
        for new in ((False, True) if index % 2 else (True, False)):
            runs[new].append(run(frames, new))
    for new, name in ((False, "old (upscale on the model thread)"), (True, "new (output.scale)")):
        cpu = [c for c, _ in runs[new]]
        print(f"{name}: video CPU {statistics.median(cpu):.3f} ms/frame "
              f"({min(cpu):.3f}-{max(cpu):.3f}) beside {MODEL_MS:g} ms of model; "
              f"{runs[new][0][1]:.0f} bytes/frame")
    ratios = [n[0] / o[0] for o, n in zip(runs[False], runs[True])]
    print(f"paired new / old: {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}), {pairs} pairs")


if __name__ == "__main__":
    main()

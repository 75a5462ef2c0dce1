"""What encoding the video costs beside the model: the encoder's CPU over the model thread's.

One session writes its frames to the config's output format (settings as `ardiff rollout`
uses them; a format the table does not mark `benched` is measured as DEFAULT_SUFFIX) in a
temporary folder, as long as a user's run makes it (at least ENCODE_MIN_BLOCKS blocks and
the config's `rollout.frames`, up to ENCODE_MAX_FRAMES), so opening and finishing the file
and its first, cold frames are spread over as many frames as a run spreads them. The model
thread's CPU time is its own (`time.thread_time`); the rest of the process's (the writer's
and the codec's threads) is the encoder's; with one torch thread, load does not move it:

    encode share = (process CPU - model thread CPU) / model thread CPU
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ardiff.bench.arms import RunnerArm
from ardiff.bench.spread import Spread
from ardiff.sizes import ceil_div
from ardiff.video.formats import FORMATS
from ardiff.video.writer import VideoWriter, output_kind

ENCODE_MIN_BLOCKS = 32  # a short rollout still measures the steady state, not the file
ENCODE_MAX_FRAMES = 480  # 30 s at 16 fps: past it the per-file cost no longer shows
DEFAULT_SUFFIX = ".mp4"  # what an output the bench does not measure is measured as


def encoded_suffixes() -> tuple[str, ...]:
    """The output formats the bench measures as themselves (formats.FORMATS' `benched`)."""
    return tuple(suffix for suffix, output in FORMATS.items() if output.benched)


@dataclass
class EncodeRun:
    model_cpu_s: float
    encoder_cpu_s: float
    write_cpu_s: float  # of model_cpu_s: handing frames to the writer (copy, queue)
    frames: int
    bytes: int

    @property
    def share(self) -> float:
        return self.encoder_cpu_s / self.model_cpu_s


def encode_blocks(blocks: int, rollout_frames: int, video_frames_per_block: int) -> int:
    """Blocks `measure_encode` makes (after the window is filled): `blocks`, at least
    ENCODE_MIN_BLOCKS, and enough for the config's `rollout.frames` up to ENCODE_MAX_FRAMES."""
    frames = min(rollout_frames, ENCODE_MAX_FRAMES)
    return max(blocks, ENCODE_MIN_BLOCKS, ceil_div(frames, video_frames_per_block))


def measure_encode(arm: RunnerArm, blocks: int, tag: str) -> EncodeRun:
    """One session, encoded as it runs: `blocks` blocks, at least ENCODE_MIN_BLOCKS, and at
    least the config's `rollout.frames` frames (up to ENCODE_MAX_FRAMES)."""
    out, rollout_frames = arm.config.output, min(arm.config.rollout.frames, ENCODE_MAX_FRAMES)
    blocks = max(blocks, ENCODE_MIN_BLOCKS)
    kind = output_kind(str(out.path))
    measured = kind in encoded_suffixes()
    settings = ({"codec": out.codec, "crf": out.crf, "preset": out.preset}
                if measured else {})  # else the default mp4, with its defaults
    settings["scale"] = out.scale  # the video's size, whatever the format
    suffix = kind if measured else DEFAULT_SUFFIX
    with tempfile.TemporaryDirectory() as tmp:
        arm.open(f"encode-{tag}")
        with VideoWriter(Path(tmp) / f"bench{suffix}", out.fps, **settings) as writer:
            process, model, write = time.process_time(), time.thread_time(), 0.0
            made = 0
            while made < blocks or writer.frames_written < rollout_frames:
                frames, made = arm.advance(), made + 1
                start = time.thread_time()
                writer.write(frames)
                write += time.thread_time() - start
            info = writer.close()
            model = time.thread_time() - model
            process = time.process_time() - process
        arm.close()
    return EncodeRun(model, process - model, write, info.frames, info.bytes)


def summarize(runs: list[EncodeRun]) -> dict:
    frames = sum(r.frames for r in runs)
    return {"share": Spread.of([r.share for r in runs]).to_dict(),
            "encoder_cpu_ms_per_frame": 1e3 * sum(r.encoder_cpu_s for r in runs) / frames,
            "model_cpu_ms_per_frame": 1e3 * sum(r.model_cpu_s for r in runs) / frames,
            "write_cpu_ms_per_frame": 1e3 * sum(r.write_cpu_s for r in runs) / frames,
            "bytes_per_frame": sum(r.bytes for r in runs) / frames, "frames": frames}

"""How long a bench runs, checked before it builds anything: its counts and its positions.

    check_counts(blocks, repeats, threads, sweep_frames)   bounds, before the config is read
    check_batch_sizes(sizes)                               `--batch`: 1 to MAX_SESSIONS, once
    check_positions(spec, pipeline, config, blocks, ...)   max_model_len, before `load`

Like a rollout's lengths (docs/configs.md#bounds), a count past its bound is a typo, and a
session that would pass the pipeline's `max_model_len` is refused up front (ConfigError,
exit 2), not after minutes of measuring. The sessions a bench opens, in frame positions:

    timed arm    | fill (sink + window, + 1 block) | --blocks                     |
    encode run   | fill                            | max(--blocks, 32, frames)    |
    sweep point  | N frames from position 0                                       |
"""

from __future__ import annotations

from typing import Any

from ardiff.bench.arms import fill_blocks
from ardiff.bench.encode import encode_blocks
from ardiff.config.run import RunConfig
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.errors import ConfigError
from ardiff.limits import MAX_FRAMES, MAX_REPEATS, MAX_SESSIONS, MAX_WORKERS
from ardiff.rollout.streams import video_frames_per_block
from ardiff.sizes import ceil_div


def check_counts(blocks: int, repeats: int, threads: int, sweep_frames: list[int]) -> None:
    """`--blocks`, `--repeats`, `--threads` and each `--sweep-frames` length within bounds."""
    counts = [("--blocks", blocks, MAX_FRAMES), ("--repeats", repeats, MAX_REPEATS),
              ("--threads", threads, MAX_WORKERS)]
    counts += [("--sweep-frames", frames, MAX_FRAMES) for frames in sweep_frames]
    for flag, value, most in counts:
        if value <= 0:
            raise ConfigError(f"{flag}: {value} is invalid; it must be > 0")
        if value > most:
            raise ConfigError(f"{flag}: {value} is invalid; it must be <= {most}")


def check_positions(spec: ARDiffusionKVCacheSpec, pipeline: Any, config: RunConfig,
                    blocks: int, sweep_frames: list[int], encode: bool) -> None:
    """Every session of the bench stays within the effective spec's `max_model_len`."""
    per_block, limit = spec.frames_per_block, spec.max_model_len
    fill = fill_blocks(spec)
    if (fill + blocks) * per_block > limit:
        raise ConfigError(f"--blocks: {blocks} timed blocks after the {fill} that fill the "
                          f"window reach frame position {(fill + blocks) * per_block}, past the "
                          f"pipeline's max_model_len of {limit}; {_at_most(limit, per_block, fill)}")
    video_per_block, _first = video_frames_per_block(pipeline, per_block)
    made = encode_blocks(blocks, config.rollout.frames, video_per_block)
    if encode and (fill + made) * per_block > limit:
        raise ConfigError(f"--blocks: the encode runs make {made} blocks after the {fill} that "
                          f"fill the window, reaching frame position {(fill + made) * per_block},"
                          f" past the pipeline's max_model_len of {limit}; add --no-encode")
    for frames in sweep_frames:
        reach = ceil_div(frames, per_block) * per_block
        if reach > limit:
            raise ConfigError(f"--sweep-frames: {frames} frames reach frame position {reach}, "
                              f"past the pipeline's max_model_len of {limit}; use at most "
                              f"{limit // per_block * per_block}")


def _at_most(limit: int, per_block: int, fill: int) -> str:
    fits = limit // per_block - fill
    if fits >= 1:
        return f"use --blocks {fits} at most"
    return "no timed block fits after them: lower runtime.kv.window_frames"


def check_batch_sizes(sizes: list[int]) -> None:
    """Each `--batch` size from 1 to MAX_SESSIONS (the most resident sessions), each once."""
    seen: set[int] = set()
    for size in sizes:
        if size <= 0:
            raise ConfigError(f"--batch: {size} is invalid; it must be > 0")
        if size > MAX_SESSIONS:
            raise ConfigError(f"--batch: {size} is invalid; it must be <= {MAX_SESSIONS}")
        if size in seen:
            raise ConfigError(f"--batch: {size} is given twice; give each batch size once, "
                              f"like 1,2,4,8")
        seen.add(size)

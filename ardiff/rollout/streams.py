"""The rollout: which blocks to run for which session, built from the config, then driven.

    plan = plan_rollout(config, spec, video_frames_per_block, first_block_frames)
    for event in iter_rollout(runner, plan): ...                # frames as they arrive

One *stream* per prompt: its own session and output file. Streams run one after another,
or round-robin under `rollout.interleave` (all resident at once). Each writes exactly
`rollout.frames` video frames; the last block is cut. A session's first block (also after
a reset) may make fewer frames (a causal video VAE: 1 for the first latent frame, 4 for
each later one), so the plan walks each stream's blocks once and block starts, switch
blocks and the positions checked against `max_model_len` are exact:

    video frames   0 .. 8 | 9 .. 20 | 21 .. 32 | ...     first block 9, then 12
    blocks              0 |       1 |        2 | ...
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

from ardiff.config.run import PromptSwitch, RunConfig
from ardiff.contract import ARDiffusionPipeline
from ardiff.contract.forward import RolloutRequest
from ardiff.contract.spec import ARDiffusionKVCacheSpec
from ardiff.engine.timing import Latency, seconds
from ardiff.errors import ConfigError, PipelineLoadError
from ardiff.rollout.inputs import output_path_for, read_actions, read_prompts
from ardiff.rollout.switches import resolve_schedule, switch_warnings
from ardiff.sizes import ceil_div

if TYPE_CHECKING:  # pragma: no cover - typing only: both import torch
    import torch

    from ardiff.engine.runner import Runner
    from ardiff.kv.plan import KVPlan


@dataclass(frozen=True)
class BlockSlot:
    """One planned block of a stream: where its frames start, the prompt in force, and the
    `on_switch` of a prompt switch that applies from this block (None: no switch)."""

    start_frame: int             # video frame of the stream where the block's frames start
    num_frames: int              # video frames the block is expected to make
    prompt: PromptSwitch
    switching: str | None
    session_block: int           # the block's index in its session (0 after a reset)


@dataclass(frozen=True)
class Stream:
    """One prompt's rollout: a session, a prompt schedule, an output path and its blocks."""

    index: int
    session_id: str
    schedule: tuple[PromptSwitch, ...]
    output_path: Path
    blocks: tuple[BlockSlot, ...] = ()


@dataclass(frozen=True)
class RolloutPlan:
    """Everything the rollout needs, checked before any compute."""

    streams: tuple[Stream, ...]
    frames: int                    # video frames written per stream
    video_frames_per_block: int    # expected; the first block of each stream confirms it
    first_block_frames: int        # a session's first block (fewer for a causal video VAE)
    actions: tuple[tuple[str, ...], ...] | None
    interleave: bool
    seed: int
    negative_prompt: str
    num_steps: int | None
    guidance_scale: float
    warnings: tuple[str, ...] = ()  # switches that do not apply where asked (switches.py)

    @property
    def blocks_per_stream(self) -> int:
        """Blocks of the longest stream (they differ only when a schedule resets)."""
        return max(len(stream.blocks) for stream in self.streams)

    def switch_block(self, switch: PromptSwitch) -> int:
        """The block a switch applies to in a session that is not reset before it: the first
        one starting at or after its frame."""
        if switch.frame is None:  # a `latent_frame` entry: `plan_rollout` converts them
            raise ValueError("switch_block needs a switch in video frames (`frame`)")
        if switch.frame <= 0:
            return 0
        rest = max(0, switch.frame - self.first_block_frames)
        return 1 + ceil_div(rest, self.video_frames_per_block)


@dataclass(frozen=True)
class BlockEvent:
    """One block's frames (already cut to what the stream still needs)."""

    stream: Stream
    block_index: int
    frames: torch.Tensor  # uint8 [F, H, W, 3]
    latency: Latency      # a float, or a DeviceLatency read at the first latency_s
    frames_written: int   # this stream's frames so far, including these
    ends_forward: bool = True  # the last block of its forward (a batch's others came first)
    started_s: float = 0.0     # time.perf_counter() when its forward began
    stages_s: Mapping[str, float] = field(default_factory=dict)  # denoise, commit: host s

    @property
    def latency_s(self) -> float:
        return seconds(self.latency)


def plan_rollout(config: RunConfig, spec: ARDiffusionKVCacheSpec, video_frames_per_block: int,
                 first_block_frames: int | None = None,
                 action_names: tuple[str, ...] | None = None,
                 latent_map: tuple[int, int] | None = None) -> RolloutPlan:
    """Build and check the plan: prompts, actions, outputs and positions (`check_capacity`
    checks it against a runner's plan once that exists). `first_block_frames` defaults to
    `video_frames_per_block`; `action_names`, the pipeline's, checks the actions
    (`ardiff.rollout.inputs.read_actions`); `latent_map` (`latent_frame_map`) converts a
    schedule's `latent_frame` entries."""
    rollout = config.rollout
    first = video_frames_per_block if first_block_frames is None else first_block_frames
    written = _schedules(config)
    schedules = [resolve_schedule(schedule, latent_map) for schedule in written]
    outputs = _output_paths(config.output.path, len(schedules))
    streams = tuple(Stream(i, f"stream-{i}", schedule, output,
                           walk_blocks(schedule, rollout.frames, first, video_frames_per_block))
                    for i, (schedule, output) in enumerate(zip(schedules, outputs)))
    actions = read_actions(rollout.actions, config.base_dir, action_names, spec.frames_per_block)
    plan = RolloutPlan(streams, rollout.frames, video_frames_per_block, first, actions,
                       rollout.interleave and len(streams) > 1, rollout.seed,
                       rollout.negative_prompt, rollout.num_steps, rollout.guidance_scale,
                       tuple(warning for schedule, stream in zip(written, streams)
                             for warning in switch_warnings(schedule, stream.schedule,
                                                            stream.blocks, latent_map)))
    _check_positions(plan, spec)
    return plan


def walk_blocks(schedule: tuple[PromptSwitch, ...], frames: int, first_block_frames: int,
                video_frames_per_block: int) -> tuple[BlockSlot, ...]:
    """The blocks that write `frames` video frames under `schedule`: a switch applies to the
    first block starting at or after its frame; a session's first block (the stream's, or the
    one after an `on_switch: reset`) makes `first_block_frames`, the others
    `video_frames_per_block`."""
    pending, current = list(schedule[1:]), schedule[0]
    slots: list[BlockSlot] = []
    start, session_block = 0, 0
    while start < frames:
        switching = None
        while pending and pending[0].position <= start:  # in video frames: resolved
            current = pending.pop(0)
            switching = current.on_switch
        if switching == "reset":
            session_block = 0
        size = first_block_frames if session_block == 0 else video_frames_per_block
        slots.append(BlockSlot(start, size, current, switching, session_block))
        start, session_block = start + size, session_block + 1
    return tuple(slots)


def output_paths(config: RunConfig) -> tuple[Path, ...]:
    """Each stream's output path, as `plan_rollout` plans them (reads the prompts file)."""
    return _output_paths(config.output.path, len(_schedules(config)))


def _output_paths(template: str, num_streams: int) -> tuple[Path, ...]:
    return tuple(output_path_for(template, i, num_streams) for i in range(num_streams))


def _schedules(config: RunConfig) -> list[tuple[PromptSwitch, ...]]:
    rollout = config.rollout
    prompts = read_prompts(rollout.prompts, config.base_dir)
    if prompts is not None:
        return [(PromptSwitch(0, prompt),) for prompt in prompts]
    if isinstance(rollout.prompt, list):
        return [tuple(rollout.prompt)]
    return [(PromptSwitch(0, rollout.prompt),)]


def _check_positions(plan: RolloutPlan, spec: ARDiffusionKVCacheSpec) -> None:
    """Refuse a rollout whose frame positions would pass max_model_len (before it starts)."""
    for stream in plan.streams:
        longest = max(slot.session_block for slot in stream.blocks) + 1
        positions = longest * spec.frames_per_block
        if positions > spec.max_model_len:
            blocks_that_fit = spec.max_model_len // spec.frames_per_block
            if blocks_that_fit == 0:
                raise ConfigError(
                    f"pipeline: one block is {spec.frames_per_block} frames, more than the "
                    f"pipeline's max_model_len of {spec.max_model_len} positions; no rollout "
                    f"fits: lower frames_per_block in pipeline.args (or raise max_model_len)")
            fit = plan.first_block_frames + (blocks_that_fit - 1) * plan.video_frames_per_block
            raise ConfigError(
                f"rollout.frames: {plan.frames} frames need {longest} blocks in a row, frame "
                f"positions up to {positions}, but the pipeline's max_model_len is "
                f"{spec.max_model_len}; lower rollout.frames to {fit} or add a prompt switch "
                f"with on_switch: reset")


def check_capacity(plan: RolloutPlan, kv_plan: KVPlan, max_sessions: int | None = None) -> None:
    """Interleaved prompts must all be resident at once; the refusal names what binds."""
    capacity = kv_plan.session_capacity
    if plan.interleave and len(plan.streams) > capacity:
        raise ConfigError(
            f"rollout.interleave: {len(plan.streams)} prompts need {len(plan.streams)} resident "
            f"sessions but {kv_plan.binding_limit(max_sessions)} keeps {capacity}; raise it, "
            f"use fewer prompts, or set rollout.interleave: false to run them one after another")


def iter_rollout(runner: Runner, plan: RolloutPlan) -> Iterator[BlockEvent]:
    """Run the plan's blocks on the runner, yielding each block's frames as they arrive.

    A stream runs until it has `plan.frames` frames (so a pipeline that makes
    fewer frames per block than declared still fills its video); then its
    session is closed, after its last frames were yielded (a failing close hook
    does not cost them).
    """
    written = {stream.index: 0 for stream in plan.streams}
    next_block = {stream.index: 0 for stream in plan.streams}
    pending = list(plan.streams)
    while pending:
        for stream in list(pending if plan.interleave else pending[:1]):
            block_index = next_block[stream.index]
            result = runner.execute(build_request(plan, stream, block_index))
            frames = result.output.frames[:plan.frames - written[stream.index]]
            written[stream.index] += int(frames.shape[0])
            next_block[stream.index] += 1
            yield BlockEvent(stream, block_index, frames, result.latency,
                             written[stream.index], started_s=result.started_s,
                             stages_s=result.stages_s)
            if written[stream.index] >= plan.frames:  # closed after its frames are handed on
                pending.remove(stream)
                runner.close_session(stream.session_id)


def build_request(plan: RolloutPlan, stream: Stream, block_index: int) -> RolloutRequest:
    """The request for one block: the prompt in force, its switch action, the block's actions.

    A block past the planned ones (a pipeline that makes fewer frames than it declared)
    keeps the last prompt and switches nothing."""
    if block_index < len(stream.blocks):
        slot = stream.blocks[block_index]
        current, switching = slot.prompt, slot.switching
    else:
        current, switching = stream.blocks[-1].prompt, None
    actions = None
    if plan.actions:
        actions = plan.actions[block_index % len(plan.actions)]
    return RolloutRequest(
        session_id=stream.session_id, block_index=block_index, prompt=current.prompt,
        negative_prompt=plan.negative_prompt, seed=plan.seed, num_steps=plan.num_steps,
        guidance_scale=plan.guidance_scale, actions=actions,
        reset=switching == "reset", clear_cross_kv=switching in ("clear-cross", "recache"),
        extra={"recache": True} if switching == "recache" else {})


def video_frames_per_block(pipeline: ARDiffusionPipeline, latent_frames: int) -> tuple[int, int]:
    """Video frames of a block, and of a session's first block: the decoder makes
    `video_frames_per_latent_frame` (default 1) per latent frame, and
    `video_frames_first_latent_frame` (default: the same) for a session's first one."""
    per = _frames_attribute(pipeline, "video_frames_per_latent_frame", 1,
                            "video frames the decoder makes per latent frame")
    first = _frames_attribute(pipeline, "video_frames_first_latent_frame", per,
                              "video frames the decoder makes for a session's first latent frame")
    return latent_frames * per, first + (latent_frames - 1) * per


def latent_frame_map(pipeline: ARDiffusionPipeline) -> tuple[int, int] | None:
    """(video frames of a session's first latent frame, of each later one) for a pipeline
    that declares `video_frames_per_latent_frame` (its schedule may give `latent_frame`);
    None for one that does not."""
    if getattr(pipeline, "video_frames_per_latent_frame", None) is None:
        return None
    per = _frames_attribute(pipeline, "video_frames_per_latent_frame", 1,
                            "video frames the decoder makes per latent frame")
    first = _frames_attribute(pipeline, "video_frames_first_latent_frame", per,
                              "video frames the decoder makes for a session's first latent frame")
    return first, per


def _frames_attribute(pipeline: ARDiffusionPipeline, name: str, default: int,
                      meaning: str) -> int:
    value = getattr(pipeline, name, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PipelineLoadError(f"pipeline: {name} is {value!r}; it must be an integer >= 1 "
                                f"({meaning}), or leave it undefined for {default}")
    return int(value)

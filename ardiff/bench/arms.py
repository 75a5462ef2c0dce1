"""The arms of a bench: things that make a rollout block by block, timed one block at a time.

    arm.open(tag)   a fresh session; its window is filled before anything is timed
    arm.step()      one timed block: wall time and the calling thread's CPU time
    arm.close()     ends the session

A runner arm drives an ardiff `Runner` (paged, dense, compiled); a reference arm drives a
hand-written loop over the same weights. Every arm of a bench gets the same requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ardiff.config.run import RunConfig
from ardiff.contract.forward import RolloutRequest
from ardiff.engine.runner import Runner
from ardiff.image import IMAGE_KEY
from ardiff.rollout.images import row_image
from ardiff.sizes import ceil_div

FILL_EXTRA = {"q_tokens": 1}  # pipelines that support it fill the window with cheap queries
EXTRA_FILL_BLOCKS = 1  # past a full window: eviction has run once before timing


def fill_blocks(spec: Any) -> int:
    """Untimed blocks that open a session: the sink and the window full, and one more."""
    return ceil_div(spec.sink_frames + spec.window_frames,
                    spec.frames_per_block) + EXTRA_FILL_BLOCKS


def block_request(config: RunConfig, session_id: str, block: int, fill: bool,
                  row: int = 0) -> RolloutRequest:
    """Block `block` of the config's rollout for session `row` of a bench: seed + row, the
    prompt (a schedule's first; a `rollout.prompts` list's in turn by row), its steps,
    guidance and actions."""
    r = config.rollout
    prompt = r.prompt if isinstance(r.prompt, str) else r.prompt[0].prompt
    if isinstance(r.prompts, list) and r.prompts:
        prompt = r.prompts[row % len(r.prompts)]
    extra: dict[str, object] = dict(FILL_EXTRA) if fill else {}
    image = row_image(config, row)
    if image is not None:  # a pipeline that starts from an image (rollout.image / images)
        extra[IMAGE_KEY] = str(image)
    return RolloutRequest(session_id, block_index=block, prompt=prompt,
                          negative_prompt=r.negative_prompt, seed=r.seed + row,
                          num_steps=r.num_steps, guidance_scale=r.guidance_scale,
                          actions=block_actions(config, block), extra=extra)


def block_actions(config: RunConfig, block: int) -> tuple[str, ...] | None:
    """The config's actions for block `block`, cycled; None when they come from a file."""
    actions = config.rollout.actions
    if not isinstance(actions, list) or not actions:
        return None
    item = actions[block % len(actions)]
    return (item,) if isinstance(item, str) else tuple(item)


@dataclass
class Times:
    """Per timed block, in run order: wall seconds and the model thread's CPU seconds."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)


class Arm:
    """One way of making the rollout. Subclasses say how a block is made."""

    def __init__(self, name: str, config: RunConfig, spec: Any) -> None:
        self.name, self.config = name, config
        self.fill_blocks = fill_blocks(spec)
        self.times = Times()
        self.frames: list[torch.Tensor] = []  # the timed blocks' frames, this session
        self.block = 0

    def open(self, tag: str, fill: bool = True) -> None:
        """A fresh session named after `tag`; `fill`: fill its window first (untimed)."""
        self.block, self.frames = 0, []
        self._open(tag)
        for _ in range(self.fill_blocks if fill else 0):
            self._make(fill=True)
            self.block += 1

    def step(self) -> torch.Tensor:
        wall, cpu = time.perf_counter(), time.thread_time()
        frames = self._make(fill=False)
        if frames.is_cuda:  # execute returns before the GPU is done (no host wait per block)
            torch.cuda.synchronize(frames.device)
        self.times.cpu_s.append(time.thread_time() - cpu)
        self.times.wall_s.append(time.perf_counter() - wall)
        self.frames.append(frames)
        self.block += 1
        return frames

    def advance(self) -> torch.Tensor:
        """One block, untimed and not kept."""
        frames = self._make(fill=False)
        self.block += 1
        return frames

    def request(self, fill: bool) -> RolloutRequest:
        """Block `self.block` of the config's rollout (its seed, prompt, steps, actions)."""
        return block_request(self.config, self.session_id, self.block, fill)

    def close(self) -> None:
        pass

    def _open(self, tag: str) -> None:
        self.session_id = f"bench-{self.name}-{tag}"

    def _make(self, fill: bool) -> torch.Tensor:
        raise NotImplementedError


class RunnerArm(Arm):
    """Blocks made by `runner.execute`: the ardiff runtime, with everything it checks."""

    def __init__(self, name: str, runner: Runner, config: RunConfig) -> None:
        super().__init__(name, config, runner.plan.spec)
        self.runner = runner

    def _make(self, fill: bool) -> torch.Tensor:
        return self.runner.execute(self.request(fill)).output.frames

    def close(self) -> None:
        self.runner.close_session(self.session_id)


class LoopArm(Arm):
    """Blocks made by a hand-written loop: `new_loop()` makes one for a fresh session, and
    `loop.step(request)` makes its next frames from the request (a plain record here)."""

    def __init__(self, name: str, new_loop: Callable[[], Any], config: RunConfig,
                 spec: Any) -> None:
        super().__init__(name, config, spec)
        self.new_loop = new_loop

    def _open(self, tag: str) -> None:
        super()._open(tag)
        self.loop = self.new_loop()

    def _make(self, fill: bool) -> torch.Tensor:
        return self.loop.step(self.request(fill=False))

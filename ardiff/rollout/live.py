"""A rollout steered while it runs: one block per step, its actions chosen at that moment.

    blocks = LiveBlocks(choose)           # choose(block_index) -> actions, or None: stop
    report = run_rollout(config, on_event, stop, blocks=blocks)
    write_action_log(path, blocks.log)    # replays with `rollout.actions: path`

The job still loads, warms up, writes, polls its stop and reports; only each block's
actions come from the caller, who may take its time (`ardiff play` waits for its tick).
It drives the plan's first stream until `choose` returns None or the stream is full. The
log holds exactly the actions of the blocks that ran, so the same config, seed and frame
count with `rollout.actions` set to it makes the same frames.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from ardiff.errors import OutputPathError
from ardiff.rollout.inputs import pipeline_actions  # noqa: F401 - ardiff play reads it here
from ardiff.rollout.streams import BlockEvent, RolloutPlan, Stream, build_request

Actions = tuple[str, ...]


class LiveBlocks:
    """The block source of a steered rollout; `log` holds each run block's actions."""

    frames_lag = 0  # a player steers by what it sees: each block's frames at once, on CUDA too

    def __init__(self, choose: Callable[[int], Actions | None]) -> None:
        self.choose = choose
        self.log: list[Actions] = []

    def __call__(self, runner: Any, plan: RolloutPlan) -> Iterator[BlockEvent]:
        stream, written = plan.streams[0], 0
        for block_index in itertools.count():
            actions = None if written >= plan.frames else self.choose(block_index)
            if actions is None:
                return
            event = step_block(runner, plan, stream, block_index, written, actions)
            self.log.append(actions)
            written = event.frames_written
            yield event


def step_block(runner: Any, plan: RolloutPlan, stream: Stream, block_index: int,
               written: int, actions: Actions) -> BlockEvent:
    """Run block `block_index` of `stream` with `actions` (the plan's request otherwise);
    its frames are cut to what the stream still needs after `written`."""
    request = dataclasses.replace(build_request(plan, stream, block_index), actions=actions)
    result = runner.execute(request)
    frames = result.output.frames[:plan.frames - written]
    return BlockEvent(stream, block_index, frames, result.latency,
                      written + int(frames.shape[0]), started_s=result.started_s,
                      stages_s=result.stages_s)


def write_action_log(path: str | Path, log: list[Actions], comment: list[str] = ()) -> None:
    """Write `log` as a `rollout.actions` file (`actions:` then one block per line) with
    `comment` lines on top. Raises OutputPathError when the file cannot be written."""
    entries = [list(actions) if len(actions) > 1 else actions[0] for actions in log]
    header = "".join(f"# {line}\n" for line in comment)
    body = yaml.safe_dump({"actions": entries}, default_flow_style=False, sort_keys=False)
    try:
        Path(path).write_text(header + body, encoding="utf-8")
    except OSError as exc:
        raise OutputPathError(f"--actions-out: cannot write {str(path)!r} ({type(exc).__name__}: "
                              f"{exc.strerror or exc}); choose a writable path") from exc

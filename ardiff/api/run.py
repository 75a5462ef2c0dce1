"""A run opened from Python: the pipeline loaded, the cache planned, frames in memory.

    with ardiff.open("run.yaml", rollout={"seed": 3}) as run:   # or open() for the default
        for block in run.blocks(frames=24):                     # the config's rollout, in memory
            block.frames                                        # numpy uint8 [F, H, W, 3]
        session = run.session(prompt="a red ball")              # steered: ardiff.api.session
        run.stats()                                             # latencies, sessions, pages

`open` builds the config as `ardiff rollout` does (the file, then keyword sections merged
into it, then `overrides` as `--set` does) and the runner as every command does
(`ardiff.engine.build`), so its checks and one-line typed errors are the CLI's. It writes
no file. Warnings (a prompt the pipeline ignores, a long prompt, a warmup that failed) are
kept in `run.warnings` and issued as `ArdiffWarning`s; nothing is printed.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ardiff.api.session import Block, Session, check_text, to_numpy
from ardiff.config.run import (
    RunConfig,
    build_config,
    read_config_data,
    with_rollout,
)
from ardiff.contract.inputs import get_pipeline_inputs
from ardiff.engine.build import build_runner, resolve
from ardiff.engine.runner import Runner, RunnerStats
from ardiff.errors import ArdiffWarning, ConfigError, WarmupError
from ardiff.rollout.inputs import ignored_prompt_message, pipeline_actions
from ardiff.rollout.streams import build_request, latent_frame_map, plan_rollout
from ardiff.rollout.streams import video_frames_per_block as block_frames

_NUMBERS = itertools.count()


def open_run(config: str | Path | RunConfig | None = None, *,
             overrides: Sequence[str] = (), **sections: Mapping[str, Any]) -> Run:
    """Open a run: `config` is a YAML path, a `RunConfig`, or None for the embedded default;
    `sections` (`runtime={"device": "cuda"}`) are merged into the file's sections and
    `overrides` are `KEY=VALUE` strings as `--set` takes them. Loads the pipeline and
    allocates its KV cache (and warms up when `warmup.enabled`). Raises ConfigError,
    PipelineLoadError, CapacityError... as `ardiff rollout` would, before any block."""
    if isinstance(config, RunConfig):
        if sections or overrides:
            raise ConfigError("open: keyword sections and overrides need a config path (or "
                              "None), not a RunConfig; change the RunConfig instead")
        return Run(config)
    data, base_dir = read_config_data(config)
    for name, values in sections.items():
        _merge(data, name, values)
    return Run(build_config(data, list(overrides), base_dir))


def _merge(data: dict[str, Any], name: str, values: object) -> None:
    if not isinstance(values, Mapping):
        raise ConfigError(f"open: {name}={values!r} is not a mapping of keys; write e.g. "
                          f"{name}={{'key': value}}")
    section = data.setdefault(name, {})
    if not isinstance(section, dict):  # None (an empty section) or a wrong value: replaced
        section = data[name] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(section.get(key), dict):
            _merge(section, key, value)
        else:
            section[key] = copy.deepcopy(value)


class Run:
    """One loaded pipeline and its KV cache, driven from Python. Close it (or use `with`)."""

    def __init__(self, config: RunConfig) -> None:
        if config.runtime.parallel.world_size > 1:
            raise ConfigError(f"runtime.parallel: {config.runtime.parallel.world_size} "
                              f"processes run from `ardiff rollout`; ardiff.open runs one "
                              f"process: set runtime.parallel.workers: 1 and cfg: 1")
        self.config = config
        self.warnings: list[str] = []
        resolved = resolve(config)
        self.spec = resolved.spec
        self.action_names = pipeline_actions(resolved.pipeline)
        self.runner: Runner = build_runner(config, resolved)
        try:
            self.inputs = get_pipeline_inputs(self.runner.pipeline)
            if config.warmup.enabled:
                self._warmup()
        except BaseException:
            self.runner.close()
            raise

    @property
    def pipeline(self) -> Any:
        return self.runner.pipeline

    # -- frames ----------------------------------------------------------------------
    def blocks(self, frames: int | None = None, prompt: str | None = None,
               actions: Sequence[str | Sequence[str]] | str | None = None,
               seed: int | None = None) -> Iterator[Block]:
        """The config's rollout (one prompt) as blocks, in memory: `frames` video frames (the
        last block cut), each argument replacing its `rollout.*` key and checked as that key
        is. Its session is closed when the iterator ends or is closed."""
        changes = {key: value for key, value in (("frames", frames), ("prompt", prompt),
                                                 ("actions", actions), ("seed", seed))
                   if value is not None}
        config = with_rollout(self.config, prompts=None, **changes)
        self._warn_ignored_prompt(prompt, "prompt")
        pipeline = self.runner.pipeline
        per_block, first = block_frames(pipeline, self.spec.frames_per_block)
        plan = plan_rollout(config, self.spec, per_block, first, self.action_names,
                            latent_frame_map(pipeline))
        return self._iter_blocks(plan, f"blocks-{next(_NUMBERS)}")

    def _iter_blocks(self, plan: Any, session_id: str) -> Iterator[Block]:
        stream, written, index = plan.streams[0], 0, 0
        try:
            while written < plan.frames:
                request = dataclasses.replace(build_request(plan, stream, index),
                                              session_id=session_id)
                result = self.runner.execute(request)
                frames = to_numpy(result.output.frames[:plan.frames - written])
                yield Block(session_id, index, written, frames, result.latency_s)
                written, index = written + len(frames), index + 1
        finally:
            if not self.runner.is_closed and session_id in self.runner.sessions:
                self.runner.close_session(session_id)

    def session(self, prompt: str | None = None, session_id: str | None = None,
                seed: int | None = None) -> Session:
        """A new session to step block by block (`Session.step`); the config's prompt and
        seed unless given."""
        if session_id is not None:
            check_text("session_id", session_id)
        return Session(self, prompt, session_id, seed)

    def stats(self) -> RunnerStats:
        """Block latencies, warmup latencies, session counts and the cache's pages so far."""
        return self.runner.stats()

    # -- checks shared with Session ------------------------------------------------------
    def check_prompt(self, field: str, prompt: str | None, default: Any = "") -> str:
        """A step's prompt, checked as config text; `default` (the config's prompt or
        schedule) when None. A prompt the pipeline ignores is a warning."""
        if prompt is None:
            prompt = default if isinstance(default, str) else default[0].prompt
            return str(prompt)
        check_text(field, prompt)
        if prompt:
            self._warn_ignored_prompt(prompt, field)
        return prompt

    def check_positions(self, session_id: str, block_index: int) -> None:
        """Refuse a block whose frame positions would pass the pipeline's max_model_len."""
        spec = self.spec
        end = (block_index + 1) * spec.frames_per_block
        if end > spec.max_model_len:
            raise ConfigError(f"session {session_id!r}: block {block_index} reaches frame "
                              f"position {end}, past the pipeline's max_model_len of "
                              f"{spec.max_model_len}; call reset() or step with "
                              f"on_switch='reset'")

    def _warn_ignored_prompt(self, prompt: Any, field: str = "rollout.prompt") -> None:
        if prompt and self.inputs is not None and not self.inputs.takes("prompt"):
            self._warn(ignored_prompt_message(field))

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        warnings.warn(message, ArdiffWarning, stacklevel=4)

    def _warmup(self) -> None:
        try:
            report = self.runner.warmup()
        except WarmupError as exc:
            self._warn(f"{exc}; continuing without warmup")
            return
        if report.leaked_pages:
            self._warn(f"warmup leaked {report.leaked_pages} KV pages")

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close every session and the runner. Safe to call twice."""
        self.runner.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

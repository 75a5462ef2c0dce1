"""A session steered from Python, one block per `step`, and the block it returns.

    with run.session(prompt="a red ball") as session:
        block = session.step(action="left")          # Block: frames uint8 [F, H, W, 3]
        block = session.step(prompt="a blue cube")   # the prompt from this block on
        session.reset()                              # the next step starts at frame 0

A session is one KV history in the run's cache (the runner owns it). Each step is checked
as the config's values are (an action of the pipeline, text without NUL, a block that fits
`max_model_len`) and raises ardiff's typed errors; a failed step closes the session
(fail-closed), so the next step starts it again at frame 0. `close()` is safe twice.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, get_args

import numpy as np

from ardiff.config.run import PromptSwitch
from ardiff.contract.forward import RolloutRequest
from ardiff.errors import ConfigError, SessionError
from ardiff.rollout.inputs import read_actions
from ardiff.text import short_repr, text_problem

if TYPE_CHECKING:  # pragma: no cover - typing only: run.py imports this module
    from ardiff.api.run import Run

ON_SWITCH: tuple[str, ...] = get_args(PromptSwitch.__annotations__["on_switch"]) or (
    "keep", "clear-cross", "reset", "recache")
_NUMBERS = itertools.count()


@dataclass(frozen=True)
class Block:
    """One AR block's frames, in memory."""

    session_id: str
    index: int            # the block's index in its session (0 after a reset)
    start_frame: int      # the session's video frame where these frames start
    frames: np.ndarray    # uint8 [F, H, W, 3]
    latency_s: float      # the block's forward (a batched forward's whole time)

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


def to_numpy(frames: Any) -> np.ndarray:
    """A block's frames (a uint8 tensor [F, H, W, 3], maybe on a device) as numpy."""
    return np.ascontiguousarray(frames.detach().cpu().numpy())


class Session:
    """One session of a run, stepped by the caller; made by `Run.session`."""

    def __init__(self, run: Run, prompt: str | None = None, session_id: str | None = None,
                 seed: int | None = None) -> None:
        rollout = run.config.rollout
        self.run = run
        self.session_id = session_id or f"session-{next(_NUMBERS)}"
        self.prompt = run.check_prompt("prompt", prompt, default=rollout.prompt)
        self.seed = rollout.seed if seed is None else seed
        self.block_index = 0      # the next block's index in the session
        self.frames_made = 0      # video frames since the session (re)started
        self._reset_next = False
        self._closed = False

    # -- stepping ---------------------------------------------------------------------
    def step(self, action: str | Sequence[str] | None = None, prompt: str | None = None,
             on_switch: str = "keep") -> Block:
        """Run the session's next block and return its frames.

        `action`: one action name for the block, or one per frame (the pipeline's
        `action_names`); `prompt`: the prompt from this block on, applied as a schedule's
        `on_switch` says (keep, clear-cross, reset, recache). Raises ConfigError for a value
        the config would refuse, SessionError when the session is closed or was evicted."""
        request = self._request(action, prompt, on_switch)
        result = self.run.runner.execute(request)
        if request.reset:
            self.frames_made = 0
        frames = to_numpy(result.output.frames)
        block = Block(self.session_id, request.block_index, self.frames_made, frames,
                      result.latency_s)
        self.block_index, self.frames_made = request.block_index + 1, self.frames_made + len(frames)
        self._reset_next = False
        return block

    def _request(self, action: str | Sequence[str] | None, prompt: str | None,
                 on_switch: str) -> RolloutRequest:
        self._check_open()
        if on_switch not in ON_SWITCH:
            raise ConfigError(f"on_switch: {short_repr(on_switch)} is not a switch; use one of "
                              f"{', '.join(ON_SWITCH)}")
        switching = None
        if prompt is not None and prompt != self.prompt:
            self.prompt, switching = self.run.check_prompt("prompt", prompt), on_switch
        reset = self._reset_next or switching == "reset"
        index = 0 if reset else self.block_index
        self.run.check_positions(self.session_id, index)
        self._check_resident(index)
        rollout = self.run.config.rollout
        return RolloutRequest(
            session_id=self.session_id, block_index=index, prompt=self.prompt,
            negative_prompt=rollout.negative_prompt, seed=self.seed,
            num_steps=rollout.num_steps, guidance_scale=rollout.guidance_scale,
            actions=self._actions(action), reset=reset,
            clear_cross_kv=switching in ("clear-cross", "recache"),
            extra={"recache": True} if switching == "recache" else {})

    def _actions(self, action: str | Sequence[str] | None) -> tuple[str, ...] | None:
        if action is None:
            return None
        entry = action if isinstance(action, str) else list(action)
        run = self.run
        actions = read_actions([entry], run.config.base_dir, run.action_names,
                               run.spec.frames_per_block, where="action")
        assert actions is not None
        return actions[0]

    def _check_resident(self, index: int) -> None:
        """A session the cache let go of (LRU eviction, a failed block) starts over."""
        if index > 0 and self.session_id not in self.run.runner.sessions:
            raise SessionError(f"session {self.session_id!r} is no longer in the cache (evicted "
                               f"for another session, or a block failed); call reset() to "
                               f"start it again, or open at most "
                               f"{self.run.runner.sessions.capacity} sessions at once")

    # -- lifecycle --------------------------------------------------------------------
    def reset(self) -> None:
        """Start the session over: the next step is its block 0 (KV history dropped then)."""
        self._check_open()
        self._reset_next, self.block_index, self.frames_made = True, 0, 0

    def close(self) -> None:
        """Free the session's KV pages now. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        runner = self.run.runner
        if not runner.is_closed and self.session_id in runner.sessions:
            runner.close_session(self.session_id)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionError(f"session {self.session_id!r} is closed; open another with "
                               f"run.session()")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_text(field: str, text: str) -> str:
    """Text as a config value must be (a str, valid Unicode, no NUL), or ConfigError."""
    if not isinstance(text, str):
        raise ConfigError(f"{field}: {short_repr(text)} is not text; give a string")
    problem = text_problem(text)
    if problem:
        raise ConfigError(f"{field}: {short_repr(text)} {problem}")
    return text

"""The per-session part of a run: a `POST /v1/sessions` body, checked with the rollout's rules.

    options = read_session_options(body, config)   # ConfigError: "seed: expected an integer..."
    options.prompt, .seed, .frames (None: open-ended), .actions, .mode, .fps, .image

Every key is optional: what a body leaves out is the server config's (`rollout.*`,
`output.fps`). The fields have the `rollout` section's types, so a bad value gets the
message the YAML would, with the body's dotted path (`prompt[1].frame: ...`). Nothing a
client sends names a file: `actions` is a list, never a path. Prompts are capped by
`serve.max_prompt_chars`, frames by `serve.max_frames`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt
from pydantic.dataclasses import dataclass

from ardiff.config import schema
from ardiff.config.run import FrameCount, PromptSwitch, RolloutConfig, RunConfig, Text
from ardiff.errors import ConfigError
from ardiff.limits import MAX_FPS, MAX_NUM_STEPS, MAX_SEED, MIN_FPS

SESSION_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")  # a client's id: URL-safe, hard to guess
Mode = Literal["paced", "fast"]
ImageFormat = Literal["jpeg", "png", "webp"]


@dataclass(frozen=True, config=ConfigDict(extra="forbid", use_attribute_docstrings=True))
class SessionBody:
    """A session's request body; every key optional (the server config's value)."""

    prompt: Text | list[PromptSwitch] | None = None
    """A prompt, or a schedule of switches starting at frame 0 (as rollout.prompt)."""
    negative_prompt: Text | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    frames: FrameCount | None = None
    """Video frames to make; null: open-ended (until serve.max_frames or DELETE); left out:
    rollout.frames (read off the body's keys: no value stands for "left out")."""
    actions: list[Text | list[Text]] | None = None
    """One action (or one per frame) per block, repeating, as rollout.actions; a client's
    `{"action": ...}` message replaces one block's."""
    num_steps: Annotated[StrictInt, Field(gt=0, le=MAX_NUM_STEPS)] | None = None
    guidance_scale: Annotated[float, Field(allow_inf_nan=False, strict=True)] | None = None
    fps: Annotated[float, Field(ge=MIN_FPS, le=MAX_FPS, strict=True)] | None = None
    """Frame rate of the video and of a paced session's blocks (None: output.fps)."""
    mode: Mode | None = None
    """paced: one block per tick at fps (as ardiff play); fast: blocks as fast as the device
    allows. None: paced for a pipeline with actions, else fast."""
    image: ImageFormat = "jpeg"
    """How frames are sent: jpeg, webp, or png (lossless)."""
    paused: StrictBool = False
    """Start paused: no block runs before `{"pause": false}` (a client misses no frame)."""


@dataclasses.dataclass(frozen=True)
class SessionOptions:
    """A checked session: the body merged over the server config."""

    config: RunConfig        # the server's config with this session's rollout and fps
    frames: int | None       # None: open-ended
    mode: Mode
    image: ImageFormat
    paused: bool = False

    @property
    def fps(self) -> float:
        return self.config.output.fps


def read_session_options(body: Any, config: RunConfig, has_actions: bool) -> SessionOptions:
    """Check a request body (parsed JSON) against the server `config`; raise ConfigError
    whose message starts with the body's dotted path. `has_actions`: the pipeline declares
    actions (then `mode` defaults to paced)."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ConfigError(f"body: expected a JSON object of session options, got "
                          f"{type(body).__name__}")
    checked = schema.validate(SessionBody, body)
    if isinstance(checked.prompt, list):  # a schedule: rollout.prompt's own rules, messages
        schema.validate(RolloutConfig, {"prompt": body["prompt"]})
    _check_prompt_lengths(checked, config.serve.max_prompt_chars)
    frames = _frames(checked.frames if "frames" in body else config.rollout.frames, config)
    given: dict[str, Any] = {
        "prompt": checked.prompt, "negative_prompt": checked.negative_prompt,
        "seed": checked.seed, "actions": checked.actions, "num_steps": checked.num_steps,
        "guidance_scale": checked.guidance_scale, "frames": frames or config.serve.max_frames}
    rollout = dataclasses.replace(config.rollout, prompts=None, interleave=False, batch=1,
                                  **{key: value for key, value in given.items()
                                     if value is not None})
    output = config.output if checked.fps is None else dataclasses.replace(
        config.output, fps=checked.fps)
    mode = checked.mode or ("paced" if has_actions else "fast")
    merged = dataclasses.replace(config, rollout=rollout, output=output)
    object.__setattr__(merged, "base_dir", config.base_dir)
    return SessionOptions(merged, frames, mode, checked.image, checked.paused)


def _frames(frames: int | None, config: RunConfig) -> int | None:
    if frames is not None and int(frames) > config.serve.max_frames:
        raise ConfigError(f"frames: {frames} is more than this server's serve.max_frames of "
                          f"{config.serve.max_frames}; ask for fewer, or null for an "
                          f"open-ended session")
    return None if frames is None else int(frames)


def _check_prompt_lengths(body: SessionBody, max_chars: int) -> None:
    prompts = ([("prompt", body.prompt)] if isinstance(body.prompt, str) else
               [(f"prompt[{i}].prompt", s.prompt) for i, s in enumerate(body.prompt or [])])
    prompts.append(("negative_prompt", body.negative_prompt or ""))
    for where, prompt in prompts:
        check_prompt_length(where, prompt, max_chars)


def check_prompt_length(where: str, prompt: str, max_chars: int) -> None:
    """Refuse a prompt longer than `serve.max_prompt_chars` (ConfigError naming `where`)."""
    if len(prompt) > max_chars:
        raise ConfigError(f"{where}: {len(prompt)} characters, more than this server's "
                          f"serve.max_prompt_chars of {max_chars}; shorten the prompt")


def check_session_id(public_id: str) -> None:
    """Refuse a client's session id that is not 16 to 128 URL-safe characters (ConfigError
    naming `id`): it goes into URLs and a balancer's hash, never into a file name."""
    if not SESSION_ID.fullmatch(public_id):
        raise ConfigError(f"id: {public_id[:40]!r} is not a session id; use 16 to 128 "
                          f"letters, digits, '-' or '_' (a random one: a UUID4's hex)")

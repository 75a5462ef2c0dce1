"""The `serve` section of a run config: how `ardiff serve` admits, paces and records sessions.

    serve:
      max_sessions: 4        # at most this many live sessions (None: what the KV plan holds)
      idle_timeout_s: 60     # a session nobody streams for this long is closed
      output_dir: null       # where each session's video is recorded (None: a temp folder)
      keep_videos: false     # false: a video goes with its session; true: it stays

Every value has a ceiling: what passes here does not fail later (docs/serve.md).
The per-session part of a run (prompt, seed, actions, frames...) is a request's body, checked
by `ardiff.serve.options` with the rules of `rollout`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StrictBool, StrictInt
from pydantic.dataclasses import dataclass

from ardiff.limits import MAX_FRAMES, MAX_SESSIONS

MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600.0  # a week: a longer idle session is a leak, not a choice
MAX_QUEUE_FRAMES = 4096   # frames waiting per client; a slow client's frames past it are dropped
MAX_BODY_BYTES = 16 * 2**20  # a session's JSON body; far above any prompt schedule


@dataclass(frozen=True, config=ConfigDict(extra="forbid", use_attribute_docstrings=True))
class ServeConfig:
    """`ardiff serve`: admission, idle sessions, client queues, recordings and limits."""

    max_sessions: Annotated[StrictInt, Field(gt=0, le=MAX_SESSIONS)] | None = None
    """Live sessions at most (None: as many as the KV plan holds); one more is refused (503)."""
    batch: Annotated[StrictInt, Field(gt=0, le=MAX_SESSIONS)] | None = None
    """Sessions advanced in one forward (a pipeline with generate_blocks); None: all that fit."""
    idle_timeout_s: Annotated[float, Field(gt=0, le=MAX_IDLE_TIMEOUT_S,
                                           allow_inf_nan=False, strict=True)] = 60.0
    """A session with no client connected for this long is closed (its pages go back)."""
    output_dir: str | None = None
    """Where each session's video is recorded (None: a temporary folder of the server's)."""
    keep_videos: StrictBool = False
    """false: a session's video is removed with the session (DELETE or idle close) and a
    temporary output folder at exit; true: videos stay in output_dir."""
    queue_frames: Annotated[StrictInt, Field(gt=0, le=MAX_QUEUE_FRAMES)] = 64
    """Frames waiting for one client; past it the oldest are dropped (and counted)."""
    max_frames: Annotated[StrictInt, Field(gt=0, le=MAX_FRAMES)] = 100_000
    """Most video frames of one session; an open-ended session (frames: null) ends there."""
    max_prompt_chars: Annotated[StrictInt, Field(gt=0, le=MAX_BODY_BYTES)] = 2000
    """Longest prompt a client may send (characters)."""
    max_body_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_BODY_BYTES)] = 65536
    """Largest request body; a larger one is refused (413)."""
    max_message_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_BODY_BYTES)] = 16384
    """Largest WebSocket message from a client; a larger one closes the stream (1009)."""
    jpeg_quality: Annotated[StrictInt, Field(ge=1, le=100)] = 85
    """Quality of the JPEG frames sent to clients (image: jpeg)."""
    retry_after_s: Annotated[StrictInt, Field(ge=1, le=3600)] = 5
    """The Retry-After of a refused session (503)."""
    stop_timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False,
                                           strict=True)] = 30.0
    """At a stop, how long the forwards in flight may still run; a forward stuck past it
    fails its sessions (their videos finished) and the server exits all the same."""

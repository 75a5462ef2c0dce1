"""What the runner hands a pipeline (`RolloutRequest`) and what it gets back (`BlockOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RolloutRequest:
    """One call into the pipeline: produce the next AR block of one session.

    `reset` releases the session before the forward (the block starts at frame
    0); `close_session` releases it after a successful forward;
    `clear_cross_kv` drops its cross-attention K/V (e.g. on a prompt switch)
    and keeps its history. `actions` holds
    the per-frame or per-block conditioning of action models; `extra` is free
    for pipeline-specific options.
    """

    session_id: str
    block_index: int = 0
    prompt: str = ""
    negative_prompt: str = ""
    seed: int = 0
    num_steps: int | None = None
    guidance_scale: float = 1.0
    actions: tuple[str, ...] | None = None
    reset: bool = False
    close_session: bool = False
    clear_cross_kv: bool = False  # drop the session's cross-attention K/V before the forward
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockOutput:
    """Decoded frames of one AR block: a `uint8` tensor `[F, H, W, 3]`."""

    frames: Any  # torch.Tensor [F, H, W, 3] uint8; typed loosely so importing is cheap
    extra: dict[str, Any] = field(default_factory=dict)

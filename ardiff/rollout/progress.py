"""What a rollout job tells a UI as it goes (through `run_rollout`'s `on_event`)."""

from __future__ import annotations

from dataclasses import dataclass

from ardiff.rollout.streams import BlockEvent


@dataclass(frozen=True)
class ProgressEvent:
    """Progress for a UI: `phase` is `warmup`, `rollout` or `done`; a `rollout` event carries
    its block (frames included), the KV pages in use after it (None: a dense cache) and
    the seconds handing its frames to the writer took (the encoder's queue full: a wait)."""

    phase: str
    frames_written: int
    frames_total: int
    block: BlockEvent | None = None
    pages_in_use: int | None = None
    encode_wait_s: float | None = None  # how long handing the block to its writer took

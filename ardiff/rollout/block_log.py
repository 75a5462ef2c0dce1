"""One record per block of a rollout: when it ran, where its time went, what it held.

    log = BlockLog(on_record=write_line)        # e.g. a JSON line per block as it comes
    run_rollout(config, on_event=log.record)    # or inside another callback
    log.records                                 # [{"stream": 0, "block": 3, ...}, ...]

A record (`BLOCK_RECORD_SCHEMA`) has the stream, session and block; `start_s` / `end_s`
from the first block's start; the forward's `latency_s` split into `denoise_s` (inside its
probe blocks: the denoising steps), `commit_s` (inside its commit) and `other_s` (the
rest: decoding, text encoding, noise); `encode_wait_s` (handing the frames to the video
writer, its first block's opening the file included); `pages_in_use` after it and
`frames`. A batched forward's blocks share its start, latency and stage times. Stage
times are host seconds: on CUDA, the time to queue the work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.rollout.progress import ProgressEvent

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
BLOCK_RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["stream", "session", "block", "start_s", "end_s", "latency_s", "denoise_s",
                 "commit_s", "other_s", "encode_wait_s", "pages_in_use", "frames"],
    "additionalProperties": False,
    "properties": {"stream": {"type": "integer"}, "session": {"type": "string"},
                   "block": {"type": "integer"}, "start_s": _NUM, "end_s": _NUM,
                   "latency_s": _NUM, "denoise_s": _NUM, "commit_s": _NUM, "other_s": _NUM,
                   "encode_wait_s": _NUM_OR_NULL,
                   "pages_in_use": {"type": ["integer", "null"]},
                   "frames": {"type": "integer"}},
}


@dataclass
class BlockLog:
    """The records of one rollout; `record` is (or is called by) the job's `on_event`."""

    on_record: Callable[[dict[str, Any]], None] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    _origin: float | None = field(default=None, repr=False)

    def record(self, event: ProgressEvent) -> None:
        """Take one `ProgressEvent`; only `rollout` events (one per block) count."""
        block = event.block
        if event.phase != "rollout" or block is None:
            return
        if self._origin is None:
            self._origin = block.started_s
        latency = block.latency_s
        denoise, commit = block.stages_s.get("denoise", 0.0), block.stages_s.get("commit", 0.0)
        start = block.started_s - self._origin
        record = {"stream": block.stream.index, "session": block.stream.session_id,
                  "block": block.block_index, "start_s": start, "end_s": start + latency,
                  "latency_s": latency, "denoise_s": denoise, "commit_s": commit,
                  "other_s": max(0.0, latency - denoise - commit),
                  "encode_wait_s": event.encode_wait_s, "pages_in_use": event.pages_in_use,
                  "frames": int(block.frames.shape[0])}
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

"""Rollout statistics: what a run did, how fast, in how much memory — and its JSON form.

`RolloutReport.to_dict()` is the `--json` output; `STATS_SCHEMA` (JSON Schema)
documents it and is checked in the tests. Times are seconds, sizes bytes.
`real_time_factor` is generated frames per second over playback fps: above 1
the model runs faster than real time.
"""

from __future__ import annotations

import copy
import math
import os
import resource
import sys
from dataclasses import dataclass, field
from typing import Any

from ardiff.kv.backends import backend_names
from ardiff.rollout.block_log import BLOCK_RECORD_SCHEMA

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "interrupted")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def current_rss_bytes() -> int:
    """Resident set size now: /proc/self/statm on Linux, else the peak so far."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def latency_summary(latencies_s: list[float]) -> dict[str, float | None]:
    """p50, p95 and max of block latencies (None each without any)."""
    return {"p50": percentile(latencies_s, 50), "p95": percentile(latencies_s, 95),
            "max": max(latencies_s) if latencies_s else None}


def batching_record(batch: int, requested: int | None, forwards: dict[int, int],
                    stream_latencies_s: dict[int, list[float]]) -> dict[str, Any]:
    """The JSON's `batching`: the batch used and asked for (None: auto), forwards by how
    many sessions they served, and each stream's blocks and block latency (a batched
    block's latency is its whole forward's)."""
    return {"batch": batch, "requested": requested,
            "forwards": {str(size): count for size, count in sorted(forwards.items())},
            "streams": [{"stream": index, "blocks": len(latencies),
                         "block_latency_s": latency_summary(latencies)}
                        for index, latencies in sorted(stream_latencies_s.items())]}


def merge_batching(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks' `batching` as one job's: the largest batch, forwards summed, every stream
    (None: no rank reported one)."""
    if not records:
        return None
    forwards: dict[int, int] = {}
    for record in records:
        for size, count in record["forwards"].items():
            forwards[int(size)] = forwards.get(int(size), 0) + count
    merged = batching_record(max(r["batch"] for r in records), records[0]["requested"],
                             forwards, {})
    merged["streams"] = sorted((s for r in records for s in r["streams"]),
                               key=lambda stream: stream["stream"])
    return merged


@dataclass
class OutputRecord:
    path: str
    codec: str
    frames: int
    bytes: int
    prompt: str


@dataclass
class RolloutReport:
    """Everything `ardiff rollout` reports. Filled by the job; rendered by the CLI."""

    status: str = "ok"
    error: str | None = None
    exit_code: int = 0
    warnings: list[str] = field(default_factory=list)
    pipeline: str = ""
    device: str = ""
    dtype: str = ""
    frames_requested: int = 0
    frames_written: int = 0
    output_fps: float = 0.0
    warmup_s: float | None = None
    rollout_s: float = 0.0
    time_to_first_frame_s: float | None = None
    block_latencies_s: list[float] = field(default_factory=list)
    kv: dict[str, Any] = field(default_factory=dict)
    sessions: dict[str, int] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    peak_device_bytes: int | None = None
    outputs: list[OutputRecord] = field(default_factory=list)
    batching: dict[str, Any] = field(default_factory=lambda: batching_record(1, None, {}, {}))
    exception: BaseException | None = field(default=None, repr=False)  # for --debug; not in JSON
    parallel: dict[str, Any] | None = None     # a parallel job (ardiff.launch): its shape
    ranks: list[dict[str, Any]] | None = None  # ... and one record per rank
    is_primary: bool = True  # False on a torchrun rank other than 0: rank 0 reports the job

    @property
    def frames_per_s(self) -> float | None:
        return self.frames_written / self.rollout_s if self.rollout_s > 0 else None

    @property
    def real_time_factor(self) -> float | None:
        fps = self.frames_per_s
        return fps / self.output_fps if fps is not None and self.output_fps > 0 else None

    def to_dict(self) -> dict[str, Any]:
        latencies = self.block_latencies_s
        return {
            "schema_version": SCHEMA_VERSION,
            "status": self.status,
            "error": self.error,
            "exit_code": self.exit_code,
            "warnings": list(self.warnings),
            "run": {"pipeline": self.pipeline, "device": self.device, "dtype": self.dtype},
            "frames": {"requested": self.frames_requested, "written": self.frames_written,
                       "output_fps": self.output_fps},
            "timing": {
                "warmup_s": self.warmup_s,
                "rollout_s": self.rollout_s,
                "time_to_first_frame_s": self.time_to_first_frame_s,
                "blocks": len(latencies),
                "block_latency_s": latency_summary(latencies),
                "frames_per_s": self.frames_per_s,
                "real_time_factor": self.real_time_factor,
            },
            "kv": dict(self.kv),
            "sessions": dict(self.sessions),
            "batching": copy.deepcopy(self.batching),
            "memory": {"peak_rss_bytes": self.peak_rss_bytes,
                       "peak_device_bytes": self.peak_device_bytes},
            "outputs": [dict(o.__dict__) for o in self.outputs],
            **({} if self.parallel is None else {"parallel": dict(self.parallel),
                                                 "ranks": list(self.ranks or [])}),
        }


_NUM = {"type": ["number", "null"]}
_INT = {"type": "integer", "minimum": 0}
_INT_OR_NULL = {"type": ["integer", "null"]}
_LATENCIES = {"type": "object", "required": ["p50", "p95", "max"],
              "properties": {"p50": _NUM, "p95": _NUM, "max": _NUM}}

STATS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ardiff rollout --json",
    "type": "object",
    "required": ["schema_version", "status", "error", "exit_code", "warnings", "run", "frames",
                 "timing", "kv", "sessions", "batching", "memory", "outputs"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "status": {"enum": list(STATUSES)},
        "error": {"type": ["string", "null"]},
        "exit_code": {"enum": [0, 1, 2, 3, 130]},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "blocks": {"type": "array", "items": BLOCK_RECORD_SCHEMA},  # with --timeline
        "run": {"type": "object", "required": ["pipeline", "device", "dtype"],
                "properties": {k: {"type": "string"} for k in ("pipeline", "device", "dtype")}},
        "frames": {"type": "object", "required": ["requested", "written", "output_fps"],
                   "properties": {"requested": _INT, "written": _INT,
                                  "output_fps": {"type": "number"}}},
        "timing": {
            "type": "object",
            "required": ["warmup_s", "rollout_s", "time_to_first_frame_s", "blocks",
                         "block_latency_s", "frames_per_s", "real_time_factor"],
            "properties": {
                "warmup_s": _NUM, "rollout_s": {"type": "number"},
                "time_to_first_frame_s": _NUM, "blocks": _INT,
                "block_latency_s": _LATENCIES,
                "frames_per_s": _NUM, "real_time_factor": _NUM,
            },
        },
        "kv": {"type": "object",
               "required": ["backend", "pages_total", "pages_in_use", "pages_peak",
                            "kv_bytes_allocated", "cross_attention_bytes", "session_capacity",
                            "bytes_per_session"],
               "properties": {"backend": {"enum": list(backend_names())},
                              "pages_total": _INT_OR_NULL, "pages_in_use": _INT_OR_NULL,
                              "pages_peak": _INT_OR_NULL, "kv_bytes_allocated": _INT,
                              "cross_attention_bytes": _INT, "session_capacity": _INT,
                              "bytes_per_session": _INT}},
        "sessions": {"type": "object",
                     "required": ["created", "evicted", "reset", "closed", "failed", "resident"],
                     "additionalProperties": _INT},
        # Sessions per forward (docs/configs.md#batching-several-prompts): the batch used and
        # asked for (null: auto), forwards by sessions in them, each stream's block latency.
        "batching": {
            "type": "object", "required": ["batch", "requested", "forwards", "streams"],
            "additionalProperties": False,
            "properties": {
                "batch": {"type": "integer", "minimum": 1},
                "requested": {"type": ["integer", "null"], "minimum": 1},
                "forwards": {"type": "object", "additionalProperties": False,
                             "patternProperties": {"^[1-9][0-9]*$": _INT}},
                "streams": {"type": "array", "items": {
                    "type": "object", "required": ["stream", "blocks", "block_latency_s"],
                    "properties": {"stream": _INT, "blocks": _INT,
                                   "block_latency_s": _LATENCIES}}}}},
        "memory": {"type": "object", "required": ["peak_rss_bytes", "peak_device_bytes"],
                   "properties": {"peak_rss_bytes": _INT, "peak_device_bytes": _INT_OR_NULL}},
        "outputs": {"type": "array", "items": {
            "type": "object", "required": ["path", "codec", "frames", "bytes", "prompt"],
            "properties": {"path": {"type": "string"}, "codec": {"type": "string"},
                           "frames": _INT, "bytes": _INT, "prompt": {"type": "string"}}}},
        # Only in a parallel job (runtime.parallel): its shape, and one record per rank.
        "parallel": {"type": "object",
                     "required": ["workers", "cfg", "world_size", "launcher", "backend"],
                     "properties": {"workers": _INT, "cfg": {"enum": [1, 2]},
                                    "world_size": _INT, "launcher": {"enum": ["spawn", "env"]},
                                    "backend": {"enum": ["gloo", "nccl"]}}},
        "ranks": {"type": "array", "items": {
            "type": "object",
            "required": ["rank", "replica", "cfg_rank", "streams", "pid", "device", "status",
                         "error", "exit_code", "timing", "kv", "memory"],
            "properties": {"rank": _INT, "replica": _INT, "cfg_rank": _INT,
                           "streams": {"type": "array", "items": _INT},
                           "pid": _INT_OR_NULL, "device": {"type": "string"},
                           "status": {"enum": list(STATUSES)},
                           "error": {"type": ["string", "null"]},
                           "exit_code": {"enum": [0, 1, 2, 3, 130]},
                           "timing": {"type": "object"}, "kv": {"type": "object"},
                           "memory": {"type": "object"}}}},
    },
}

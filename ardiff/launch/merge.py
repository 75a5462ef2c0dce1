"""The ranks' results -> one job report: totals as one process reports them, plus
`parallel` (the job's shape) and `ranks[]` (one record per rank).

Totals: frames, sessions and outputs come from the ranks that write (the first of each
CFG group; its peer makes the same frames); KV pages and bytes and peak memory are summed
over every rank (what the job held); `session_capacity` and `bytes_per_session` are one
rank's (the ranks agree on the capacity). `rollout_s` is the longest rank's, so frames per
second is the job's. A job is `ok` only if every rank is. Otherwise its status, exit code
and error are its cause's, named once: a rank's own failure, else the job's own stop (the
parent's signal), else a rank's own signal, else a peer's reaction; ranks that failed
alike are named together, the others that ended early follow as "stopped too".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, TypedDict

from ardiff.engine.sessions import SessionCounts
from ardiff.errors import EXIT_FAILED, EXIT_INTERRUPTED
from ardiff.rollout.report import OutputRecord, RolloutReport, merge_batching

if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing_extensions import NotRequired

SUMMED_KV = ("pages_total", "pages_in_use", "pages_peak", "kv_bytes_allocated",
             "cross_attention_bytes")


class RankResult(TypedDict):
    """One rank's result as plain data (pickled to the parent, or gathered by torchrun):
    `launch.worker.rank_result` makes it. `report` is `RolloutReport.to_dict()`, or only
    status, error and exit_code for a rank that never got to a rollout. `signal`: the stop
    signal that reached this rank from outside the job (not from its parent or its peers)."""

    rank: int
    replica: int
    cfg_rank: int
    writes: bool
    pid: int
    threads: int
    device: str
    report: dict[str, Any]
    block_latencies_s: list[float]
    peer_lost: bool
    signal: str | None
    wall_s: NotRequired[float]


@dataclass
class Failure:
    """A rank that did not end `ok`, as the parent saw it, in the order it came: it failed,
    or it was interrupted (by a signal of its own: `signal`; else by the job's stop)."""

    rank: int
    message: str
    exit_code: int = EXIT_FAILED
    peer_lost: bool = False  # a reaction to another rank leaving, not a cause
    status: str = "failed"
    signal: str | None = None

    @property
    def is_own(self) -> bool:
        """A failure of the rank itself (not a peer leaving, not a stop)."""
        return self.status == "failed" and not self.peer_lost


@dataclass
class JobOutcome:
    """What the parent gathered: each rank's result, failures in order, the job's own stop."""

    results: dict[int, RankResult] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    stop_reason: str | None = None

    def add_result(self, result: RankResult) -> None:
        self.results[result["rank"]] = result
        report = result["report"]
        if report["status"] != "ok":
            self.failures.append(Failure(result["rank"], report["error"], report["exit_code"],
                                         result["peer_lost"], report["status"],
                                         result.get("signal")))

    @property
    def cause(self) -> Failure | None:
        """The failure the job reports: a rank's own, else (no stop of the job's own) a
        rank's own signal, else the first of any; None: every rank ended ok, or the job's
        own stop explains the rest."""
        own = [f for f in self.failures if f.is_own]
        if own or self.stop_reason is not None:
            return own[0] if own else None
        signalled = [f for f in self.failures if f.signal is not None]
        first = signalled or self.failures
        return first[0] if first else None


def unallocated_kv(backend: str) -> dict[str, Any]:
    """The `kv` of a job in which no rank got as far as allocating its cache."""
    return {"backend": backend, "pages_total": 0, "pages_in_use": 0, "pages_peak": 0,
            "kv_bytes_allocated": 0, "cross_attention_bytes": 0, "session_capacity": 0,
            "bytes_per_session": 0}


def no_sessions() -> dict[str, int]:
    """The `sessions` of a job in which no writing rank got to its rollout."""
    return SessionCounts().as_dict()


def merge(outcome: JobOutcome, report: RolloutReport, streams: dict[int, list[int]],
          output_order: list[Path]) -> RolloutReport:
    """Fill `report` (pipeline, frames requested, `parallel`, and `kv` and `sessions` for a
    job that allocates nothing, already set) from the ranks. `streams`: every rank of the
    job -> its stream indices; `output_order`: the planned output paths."""
    results = [outcome.results[r] for r in sorted(outcome.results)]
    writers = [r["report"] for r in results if r["writes"] and "frames" in r["report"]]
    full = [r["report"] for r in results if "frames" in r["report"]]
    report.frames_written = sum(w["frames"]["written"] for w in writers)
    report.warmup_s = _max(r["timing"]["warmup_s"] for r in full)
    report.rollout_s = _max(r["timing"]["rollout_s"] for r in full) or 0.0
    report.time_to_first_frame_s = _min(w["timing"]["time_to_first_frame_s"] for w in writers)
    report.block_latencies_s = [s for r in results if r["writes"] for s in r["block_latencies_s"]]
    report.kv = _kv(full) or report.kv
    report.sessions = _summed([w["sessions"] for w in writers]) or report.sessions
    report.batching = merge_batching([w["batching"] for w in writers]) or report.batching
    report.peak_rss_bytes = sum(r["memory"]["peak_rss_bytes"] for r in full)
    devices = [r["memory"]["peak_device_bytes"] for r in full]
    report.peak_device_bytes = sum(devices) if devices and None not in devices else None
    report.outputs = _outputs(writers, output_order)
    report.warnings = [f"rank {r['rank']}: {w}" for r in results
                       for w in r["report"].get("warnings", [])]
    report.ranks = [_rank_record(r, streams.get(r["rank"], [])) for r in results]
    _set_status(report, outcome, sorted(set(streams) - set(outcome.results)))
    return report


def _set_status(report: RolloutReport, outcome: JobOutcome, missing: list[int]) -> None:
    """`missing`: ranks of the job whose result never came (torchrun: a rank that failed
    before the gather could reach it)."""
    cause = outcome.cause
    if cause is not None:
        alike = [f.rank for f in outcome.failures
                 if (f.message, f.status) == (cause.message, cause.status)]
        others = [f.rank for f in outcome.failures if f.rank not in alike]
        report.status, report.error = cause.status, (f"{_ranks(sorted(alike))}: {cause.message}"
                                                     f"{_others(sorted(others), missing)}")
        report.exit_code = cause.exit_code or (EXIT_INTERRUPTED if cause.status == "interrupted"
                                               else EXIT_FAILED)
    elif outcome.stop_reason is not None and (outcome.failures or not _complete(report)):
        report.status, report.exit_code = "interrupted", EXIT_INTERRUPTED
        report.error = f"interrupted by {outcome.stop_reason}"
    elif missing:
        report.status, report.exit_code = "failed", EXIT_FAILED
        report.error = f"{_ranks(missing)}: no result reached rank 0"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _others(stopped: list[int], missing: list[int]) -> str:
    notes = [f"stopped too: {_ranks(stopped)}"] if stopped else []
    notes += [f"no result from {_ranks(missing)}"] if missing else []
    return f" ({'; '.join(notes)})" if notes else ""


def _complete(report: RolloutReport) -> bool:
    return report.frames_written >= report.frames_requested


def _kv(reports: list[dict[str, Any]]) -> dict[str, Any]:
    if not reports:
        return {}
    kv = dict(reports[0]["kv"])
    for key in SUMMED_KV:
        values = [r["kv"].get(key) for r in reports]
        kv[key] = None if None in values else sum(values)
    return kv


def _summed(dicts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in dicts:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return total


def _outputs(writers: list[dict[str, Any]], order: list[Path]) -> list[OutputRecord]:
    """Every written file, in stream order."""
    rank_of = {str(path.expanduser().resolve()): i for i, path in enumerate(order)}
    records = [OutputRecord(**o) for w in writers for o in w["outputs"]]
    return sorted(records, key=lambda o: rank_of.get(str(Path(o.path).resolve()), len(order)))


def _rank_record(result: RankResult, streams: list[int]) -> dict[str, Any]:
    report = result["report"]
    timing = report.get("timing", {})
    return {"rank": result["rank"], "replica": result["replica"],
            "cfg_rank": result["cfg_rank"], "streams": streams, "pid": result["pid"],
            "device": result["device"], "threads": result["threads"],
            "status": report["status"], "error": report["error"],
            "exit_code": report["exit_code"],
            "timing": {"wall_s": result.get("wall_s"), "warmup_s": timing.get("warmup_s"),
                       "rollout_s": timing.get("rollout_s"), "blocks": timing.get("blocks"),
                       "frames_per_s": timing.get("frames_per_s")},
            "writes": result["writes"],  # a CFG group's second rank makes, not writes
            "frames_written": _written(result),
            "kv": report.get("kv", {}), "sessions": report.get("sessions", {}),
            "memory": report.get("memory", {})}


def _written(result: RankResult) -> int:
    return result["report"].get("frames", {}).get("written", 0) if result["writes"] else 0


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None

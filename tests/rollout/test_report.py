"""Rollout statistics (ardiff/rollout/report.py): percentiles, rates, and the JSON form and its schema."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from ardiff.rollout.report import (
    STATS_SCHEMA,
    OutputRecord,
    RolloutReport,
    peak_rss_bytes,
    percentile,
)

KV = {"backend": "paged", "pages_total": 43, "pages_in_use": 0, "pages_peak": 13,
      "kv_bytes_allocated": 1_409_024, "cross_attention_bytes": 0, "session_capacity": 4,
      "bytes_per_session": 339_968}
SESSIONS = {"created": 1, "reset": 0, "closed": 1, "evicted": 0, "failed": 0, "resident": 0}


def full_report(**fields) -> RolloutReport:
    report = RolloutReport(pipeline="pkg.mod:Model", device="cpu", dtype="float32",
                           frames_requested=12, frames_written=12, output_fps=16.0,
                           warmup_s=0.2, rollout_s=0.5, time_to_first_frame_s=0.05,
                           block_latencies_s=[0.1, 0.2, 0.3, 0.4], kv=dict(KV),
                           sessions=dict(SESSIONS), peak_rss_bytes=1 << 28,
                           outputs=[OutputRecord("out.mp4", "libx264", 12, 1234, "a cat")])
    for name, value in fields.items():
        setattr(report, name, value)
    return report


def test_percentile_interpolates_linearly():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile([7.0], 95) == 7.0 and percentile([], 50) is None


def test_rates_follow_frames_time_and_fps():
    report = full_report()
    assert report.frames_per_s == pytest.approx(24.0)       # 12 frames in 0.5 s
    assert report.real_time_factor == pytest.approx(1.5)    # 24 fps made, 16 fps played
    assert full_report(rollout_s=0.0).frames_per_s is None
    assert full_report(rollout_s=0.0).real_time_factor is None
    assert full_report(output_fps=0.0).real_time_factor is None


def test_to_dict_holds_the_numbers_and_no_exception():
    data = full_report(exception=RuntimeError("boom")).to_dict()

    assert data["timing"]["blocks"] == 4
    assert data["timing"]["block_latency_s"] == {"p50": pytest.approx(0.25),
                                                 "p95": pytest.approx(0.385), "max": 0.4}
    assert data["timing"]["real_time_factor"] == pytest.approx(1.5)
    assert data["frames"] == {"requested": 12, "written": 12, "output_fps": 16.0}
    assert data["outputs"] == [{"path": "out.mp4", "codec": "libx264", "frames": 12,
                                "bytes": 1234, "prompt": "a cat"}]
    assert "exception" not in json.dumps(data)


@pytest.mark.parametrize("status, exit_code, error", [
    ("ok", 0, None), ("failed", 1, "RuntimeError: boom"), ("interrupted", 130, "interrupted")])
def test_every_status_validates_against_the_schema(status, exit_code, error):
    jsonschema.validate(full_report(status=status, exit_code=exit_code, error=error).to_dict(),
                        STATS_SCHEMA)


def test_a_run_that_made_nothing_validates():
    empty = full_report(frames_written=0, warmup_s=None, rollout_s=0.0,
                        time_to_first_frame_s=None, block_latencies_s=[], outputs=[],
                        status="failed", exit_code=1, error="x")
    data = empty.to_dict()
    jsonschema.validate(data, STATS_SCHEMA)
    assert data["timing"]["block_latency_s"] == {"p50": None, "p95": None, "max": None}
    assert data["timing"]["real_time_factor"] is None


def test_the_dense_backend_has_no_page_counts_and_validates():
    kv = {**KV, "backend": "dense", "pages_total": None, "pages_in_use": None,
          "pages_peak": None}
    jsonschema.validate(full_report(kv=kv).to_dict(), STATS_SCHEMA)


@pytest.mark.parametrize("edit", [
    lambda d: d.update(extra=1),                          # unknown top-level key
    lambda d: d.update(status="done"),                    # unknown status
    lambda d: d.update(exit_code=4),                      # not an exit code (docs/errors.md)
    lambda d: d["timing"].pop("real_time_factor"),
    lambda d: d["kv"].update(backend="sparse"),
    lambda d: d["sessions"].pop("evicted"),
    lambda d: d["outputs"][0].pop("frames"),
    lambda d: d["frames"].update(written=-1),
])
def test_the_schema_rejects_broken_reports(edit):
    data = copy.deepcopy(full_report().to_dict())
    edit(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, STATS_SCHEMA)


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(STATS_SCHEMA)


def test_peak_rss_is_a_plausible_byte_count():
    assert 1 << 20 < peak_rss_bytes() < 1 << 40

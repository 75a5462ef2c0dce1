"""A pipeline written only from the upstream contract runs through inspect-spec, warmup and
rollout unchanged (tests/support/upstream_pipeline.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from typer.testing import CliRunner

from ardiff_cli.main import app

PIPELINE = Path(__file__).parents[1] / "support" / "upstream_pipeline.py"


def config(tmp_path: Path) -> Path:
    path = tmp_path / "upstream.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline": {"entry": f"{PIPELINE}:UpstreamStylePipeline"},
        "runtime": {"device": "cpu", "memory_budget": "16MiB"},
        "rollout": {"frames": 12},
        "output": {"path": str(tmp_path / "out.npy")}}))
    return path


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_inspect_spec_reports_the_positional_spec(tmp_path):
    result = invoke("inspect-spec", config(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)["spec"]
    assert spec["kv_branches"] == [{"name": "main", "local_index": 0}]
    assert (spec["window_frames"], spec["sink_frames"], spec["session_capacity"]) == (6, 1, 2)
    assert spec["max_model_len"] == 1 << 20


def test_warmup_runs_the_session_id_requests_and_gives_every_page_back(tmp_path):
    result = invoke("warmup", config(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert len(summary["latencies_s"]) == 5 and summary["leaked_pages"] == 0
    assert summary["skipped_reason"] is None


def test_rollout_makes_the_frames_the_window_implies(tmp_path):
    result = invoke("rollout", config(tmp_path), "--quiet")
    assert result.exit_code == 0, result.output
    video = np.load(tmp_path / "out.npy")
    assert video.shape == (12, 8, 8, 3)
    # Block b (frames 2b, 2b+1) sees the sink (frame 0), the last 4 frames before it and
    # itself: the mean position of those frames, times 16, is its colour.
    levels = []
    for b in range(6):
        own = [2 * b, 2 * b + 1]
        past = [f for f in range(max(1, 2 * b - 4), 2 * b)]
        seen = ([0] if b else []) + past + own
        levels += [int(16 * np.mean(seen))] * 2
    assert video[:, 0, 0, 0].tolist() == levels

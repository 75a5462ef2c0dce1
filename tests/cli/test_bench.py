"""`ardiff bench`: the numbers it prints come from real side-by-side runs."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from ardiff_cli.main import app

TINY = {"pipeline": {"entry": "ardiff.pipelines.synthetic:SyntheticAttention",
                     "args": {"num_layers": 1, "num_kv_heads": 1, "head_size": 8,
                              "tokens_per_frame": 4, "frames_per_block": 2, "window_frames": 4,
                              "sink_frames": 1}},
        "runtime": {"memory_budget": "16MiB"}, "output": {"fps": 8}}


def run_bench(tmp_path, *args: str):
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return CliRunner().invoke(app, ["bench", str(config), "--blocks", "2", "--repeats", "2",
                                    *args])


def test_bench_json_has_both_backends_equal_frames_and_exact_paged_bytes(tmp_path):
    result = run_bench(tmp_path, "--sweep-frames", "8,40", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    paged, dense = data["backends"]["paged"], data["backends"]["dense"]
    assert paged["median_block_s"] > 0 and dense["median_block_s"] > 0
    assert data["paged_over_dense"] == paged["median_block_s"] / dense["median_block_s"]
    assert data["max_abs_frame_diff"] <= 1
    assert paged["kv_bytes_vs_plan_min"] == 1.0
    assert data["encode"]["with_s"] > 0 and data["encode"]["overhead"] is not None
    assert [p["frames"] for p in data["sweep"]] == [8, 40]
    assert data["startup_s"]["help"] > 0
    # The window bounds the pages whatever the length: history + one block in flight.
    assert data["sweep"][0]["pages_in_use_max"] == data["sweep"][1]["pages_in_use_max"]


def test_bench_table_prints_targets_and_no_encode_skips_the_encode_runs(tmp_path, monkeypatch):
    monkeypatch.setattr("ardiff_cli.bench.startup_seconds", lambda args: 0.25)
    result = run_bench(tmp_path, "--no-encode")
    assert result.exit_code == 0, result.output
    assert "paged / dense" in result.stdout and "<= 1.03" in result.stdout
    assert "encode overhead" not in result.stdout
    assert "start-up" in result.stdout and "250.0 ms" in result.stdout


def test_a_bad_sweep_is_a_usage_error(tmp_path):
    result = run_bench(tmp_path, "--sweep-frames", "100,x")
    assert result.exit_code == 2
    assert "positive frame counts" in result.output

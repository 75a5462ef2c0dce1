"""`ardiff bench`: the numbers it prints come from real side-by-side runs.

Bench times the start-up of six fresh `ardiff` processes (4 s on two cores): the in-process
runs record which command lines it would time instead, and one slow test times the
installed command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ardiff_cli.bench import startup_seconds
from ardiff_cli.main import app

STARTUP_S = 0.25  # what the recorded start-up timings report

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


@pytest.fixture
def timed_commands(monkeypatch) -> list[list[str]]:
    """The `ardiff` command lines bench asks to time, each reported as STARTUP_S."""
    timed = []

    def record(args: list[str]) -> float:
        timed.append(args)
        return STARTUP_S

    monkeypatch.setattr("ardiff_cli.bench.startup_seconds", record)
    return timed


def test_bench_json_has_both_backends_equal_frames_and_exact_paged_bytes(tmp_path,
                                                                         timed_commands):
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
    assert data["startup_s"] == {"help": STARTUP_S, "inspect_spec": STARTUP_S}
    assert timed_commands == [["--help"], ["inspect-spec", str(tmp_path / "bench.yaml")]]
    # The window bounds the pages whatever the length: history + one block in flight.
    assert data["sweep"][0]["pages_in_use_max"] == data["sweep"][1]["pages_in_use_max"]


def test_bench_table_prints_targets_and_no_encode_skips_the_encode_runs(tmp_path,
                                                                        timed_commands):
    result = run_bench(tmp_path, "--no-encode")
    assert result.exit_code == 0, result.output
    assert "paged / dense" in result.stdout and "<= 1.03" in result.stdout
    assert "encode overhead" not in result.stdout
    assert "start-up" in result.stdout and "250.0 ms" in result.stdout


def test_a_bad_sweep_is_a_usage_error(tmp_path):
    result = run_bench(tmp_path, "--sweep-frames", "100,x")
    assert result.exit_code == 2
    assert "positive frame counts" in result.output


@pytest.mark.slow
def test_startup_seconds_times_the_installed_command():
    seconds = startup_seconds(["--help"], runs=1)
    assert seconds is not None and seconds > 0, "no ardiff command is installed"


@pytest.mark.parametrize("name, fragment", [
    ("missing/x.json", "is in a folder that does not exist"),
    ("bench.yaml", "is the same file as config"),  # the numbers would overwrite the config
])
def test_a_bad_json_path_is_refused_before_the_benchmark_runs(tmp_path, monkeypatch, name,
                                                              fragment):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran before --json was checked")

    monkeypatch.setattr("ardiff.bench.run_bench", must_not_run)
    result = run_bench(tmp_path, "--json", str(tmp_path / name))

    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --json: "), result.stderr
    assert fragment in lines[0]


def test_a_json_file_that_cannot_be_written_is_one_error_line_after_the_table(tmp_path,
                                                                             timed_commands):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    result = run_bench(tmp_path, "--no-encode", "--json", "/dev/full")

    assert result.exit_code == 1, result.output
    assert "paged / dense" in result.stdout
    assert result.stderr.splitlines()[-1] == (
        "error: --json: cannot write '/dev/full' (OSError: [Errno 28] No space left on device); "
        "check free disk space and permissions")
    assert "Traceback" not in result.output

"""`ardiff warmup CONFIG`: tables, --json, flags, and the exit codes (docs/errors.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ardiff.config.run import load_config
from ardiff.engine.build import inspect_spec
from ardiff.engine.runner import Runner, WarmupReport
from ardiff_cli.main import app

TESTS_DIR = Path(__file__).parents[1]
PIPELINES_FILE = TESTS_DIR / "support" / "probe_pipeline.py"
TINY_DIT_CONFIG = TESTS_DIR.parent / "configs" / "tiny-dit.yaml"
PROBE_PAGES_PER_SESSION = 3  # sink 1 + (window 4 - block 2) frames, one page each
PROBE_INFLIGHT_PAGES = 2     # one block of 2 frames
JSON_KEYS = {"status", "skipped_reason", "latencies_s", "total_s", "pages_in_use_before",
             "pages_in_use_after", "leaked_pages", "pages_total", "kv_bytes_allocated",
             "session_capacity", "backend"}


def probe_config(tmp_path: Path, cls: str = "ProbePipeline", **args) -> Path:
    data = {"pipeline": {"entry": f"{PIPELINES_FILE}:{cls}", "args": args},
            "runtime": {"device": "cpu", "memory_budget": "64MiB"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def warmup(*args: object):
    return CliRunner().invoke(app, ["warmup", *map(str, args)])


def assert_one_error_line(result, exit_code: int, *fragments: str) -> None:
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


# -- success ---------------------------------------------------------------------------------
def test_table_shows_latencies_and_pages(tmp_path):
    result = warmup(probe_config(tmp_path, warmup_blocks=3))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Warmup" in out and out.count(" ms ") == 3  # one latency row per request
    assert "pages in use before / after" in out and "0 / 0" in out
    assert "sessions that fit" in out and result.stderr == ""


def test_table_without_pages_on_the_dense_backend(tmp_path):
    result = warmup(probe_config(tmp_path), "--set", "runtime.kv.backend=dense")
    assert result.exit_code == 0, result.output
    assert "pages in use before / after" in result.stdout and "None" not in result.stdout


def test_json_reports_a_full_pool_after_warmup(tmp_path):
    result = warmup(probe_config(tmp_path, warmup_blocks=3), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary) >= JSON_KEYS
    assert summary["status"] == "ok" and summary["skipped_reason"] is None
    assert len(summary["latencies_s"]) == 3 and all(x > 0 for x in summary["latencies_s"])
    assert summary["total_s"] >= sum(summary["latencies_s"]) * 0.99
    assert (summary["pages_in_use_before"], summary["pages_in_use_after"]) == (0, 0)
    assert summary["leaked_pages"] == 0 and summary["backend"] == "paged"
    assert summary["session_capacity"] == 8  # the spec's cap; 64MiB holds far more
    assert summary["pages_total"] == 8 * PROBE_PAGES_PER_SESSION + PROBE_INFLIGHT_PAGES


def test_the_shipped_tiny_dit_config_warms_up():
    result = warmup(TINY_DIT_CONFIG, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "ok" and len(summary["latencies_s"]) >= 2
    assert summary["pages_in_use_after"] == 0 == summary["leaked_pages"]


def test_flags_reach_the_runtime(tmp_path):
    config = probe_config(tmp_path)
    base = json.loads(warmup(config, "--json").stdout)
    plan = inspect_spec(load_config(config)).plan
    two_sessions = plan.fixed_bytes + 2 * plan.bytes_per_session

    small = warmup(config, "--json", "--budget", two_sessions, "--device", "cpu")
    half = warmup(config, "--json", "--dtype", "bfloat16")
    dense = warmup(config, "--json", "--set", "runtime.kv.backend=dense")

    assert small.exit_code == half.exit_code == dense.exit_code == 0
    assert json.loads(small.stdout)["session_capacity"] == 2
    assert json.loads(half.stdout)["kv_bytes_allocated"] * 2 == base["kv_bytes_allocated"]
    dense = json.loads(dense.stdout)
    assert dense["backend"] == "dense" and dense["status"] == "ok"
    assert dense["pages_total"] is None and dense["leaked_pages"] == 0


# -- skipped ---------------------------------------------------------------------------------
def test_a_pipeline_without_warmup_is_skipped_with_exit_0(tmp_path):
    result = warmup(probe_config(tmp_path, "NoWarmupPipeline"))
    assert result.exit_code == 0, result.output
    assert "skipped" in result.stderr and "Traceback" not in result.output
    assert "None" not in result.stdout


def test_a_skipped_warmup_in_json(tmp_path):
    result = warmup(probe_config(tmp_path, "NoWarmupPipeline"), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "skipped" and "warmup" in summary["skipped_reason"]
    assert summary["latencies_s"] == [] and summary["leaked_pages"] == 0


# -- failures and their exit codes -------------------------------------------------------------
@pytest.mark.parametrize("fail_in", ["forward", "requests"])
def test_a_raising_warmup_exits_1_with_one_line(tmp_path, fail_in):
    result = warmup(probe_config(tmp_path, "FailingWarmupPipeline", fail_in=fail_in))
    assert_one_error_line(result, 1, "warmup failed", "injected fault")
    assert result.stdout == ""


def test_debug_shows_the_traceback(tmp_path):
    result = warmup(probe_config(tmp_path, "FailingWarmupPipeline"), "--debug")
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "injected fault in a warmup forward" in result.stderr


def test_leaked_pages_exit_1_after_the_report(tmp_path, monkeypatch):
    def leaky_warmup(self):
        return WarmupReport(latencies_s=[0.01], total_s=0.01, pages_in_use_before=0,
                            pages_in_use_after=2)

    monkeypatch.setattr(Runner, "warmup", leaky_warmup)
    result = warmup(probe_config(tmp_path), "--json")
    assert_one_error_line(result, 1, "warmup leaked 2 KV pages")
    assert json.loads(result.stdout)["leaked_pages"] == 2


@pytest.mark.parametrize("args, fragment", [
    (["--set", "runtime.bogus=1"], "runtime.bogus"),
    (["--dtype", "float8"], "runtime.dtype"),
    (["--budget", "lots"], "runtime.memory_budget"),
    (["--set", "pipeline.args.no_such_arg=1"], "no_such_arg"),
])
def test_a_config_error_exits_2(tmp_path, args, fragment):
    assert_one_error_line(warmup(probe_config(tmp_path), *args), 2, fragment)


def test_a_missing_config_exits_2(tmp_path):
    assert_one_error_line(warmup(tmp_path / "nope.yaml"), 2, "nope.yaml")


def test_a_budget_that_holds_no_session_exits_3(tmp_path):
    result = warmup(probe_config(tmp_path), "--budget", "1KiB")
    assert_one_error_line(result, 3, "runtime.memory_budget", "cannot hold one session")

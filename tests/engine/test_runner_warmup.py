"""The runner's warmup (docs/design.md#5-runner-and-sessions) and build_runner: load before measuring and planning.

Same probe pipelines as tests/engine/test_runner.py (tests/support/probe_pipeline.py).
"""

from __future__ import annotations

import probe_pipeline as probe
import pytest
import torch
from runner_support import HISTORY_PAGES, frame_ids, make_runner, pages_in_use, probe_config, run

import ardiff
from ardiff.config.run import load_config
from ardiff.engine import build as build_module
from ardiff.engine.build import build_runner
from ardiff.engine.runner import WARMUP_SESSION_ID


# -- warmup -----------------------------------------------------------------------------------
def test_warmup_gives_every_page_back_and_is_kept_apart():
    runner = make_runner(probe.ProbePipeline(warmup_blocks=4))

    report = runner.warmup()

    assert report.skipped_reason is None
    assert (report.pages_in_use_before, report.pages_in_use_after, report.leaked_pages) == (0, 0, 0)
    assert len(report.latencies_s) == 4 and report.total_s >= sum(report.latencies_s) * 0.99
    stats = runner.stats()
    assert stats.cache.pages_in_use == 0 and stats.cache.pages_peak > 0
    assert stats.cache.cross_attention_bytes == 0 and len(runner.sessions) == 0
    assert stats.warmup_latencies_s == report.latencies_s and stats.block_latencies_s == []
    assert set(stats.sessions.values()) == {0}  # the warmup session is nobody's session
    pipeline = runner.pipeline
    assert [r.session_id for r in pipeline.blocks] == [WARMUP_SESSION_ID] * 4
    assert pipeline.blocks[-1].visible_frames == (0, 4, 5)  # it filled the window and evicted
    assert pipeline.hook_calls[-1] == ("close", WARMUP_SESSION_ID) and pipeline.model_state == {}

    run(runner, "a", 2)
    stats = runner.stats()
    assert len(stats.block_latencies_s) == 2 and len(stats.warmup_latencies_s) == 4
    assert stats.sessions["created"] == 1


def test_warmup_leaves_resident_sessions_alone():
    runner = make_runner(capacity=2)
    run(runner, "a", 2)
    runner.warmup()
    assert runner.sessions.session_ids == ["a"] and pages_in_use(runner) == HISTORY_PAGES
    assert frame_ids(run(runner, "a", 1, first_block=2)[0]) == [4, 5]


def test_warmup_is_skipped_for_a_pipeline_without_it():
    runner = make_runner(probe.NoWarmupPipeline())
    report = runner.warmup()
    assert "no warmup" in report.skipped_reason
    assert report.latencies_s == [] and report.leaked_pages == 0
    assert runner.pipeline.hook_calls == []
    assert frame_ids(run(runner, "a", 1)[0]) == [0, 1]


@pytest.mark.parametrize("fail_in, message", [
    ("forward", "injected fault in a warmup forward"),
    ("requests", "injected fault building warmup requests"),
])
def test_a_failing_warmup_raises_warmup_error_and_gives_pages_back(fail_in, message):
    runner = make_runner(probe.FailingWarmupPipeline(fail_in=fail_in))
    with pytest.raises(ardiff.WarmupError, match=f"warmup failed: .*{message}"):
        runner.warmup()
    assert pages_in_use(runner) == 0 and len(runner.sessions) == 0
    assert runner.cache.cross.num_entries() == 0
    assert set(runner.stats().sessions.values()) == {0}
    if fail_in == "forward":
        assert runner.pipeline.hook_calls[-1] == ("close", WARMUP_SESSION_ID)
    assert frame_ids(run(runner, "a", 1)[0]) == [0, 1]


# -- build_runner: load before planning --------------------------------------------------
def test_build_runner_calls_load_before_measuring_memory_and_planning(tmp_path, monkeypatch):
    built = []
    real_build = build_module.build_pipeline
    monkeypatch.setattr(build_module, "build_pipeline",
                        lambda *args: built.append(real_build(*args)) or built[-1])
    measured = []

    def free_memory_after_load(device):
        measured.append((device, list(built[0].load_calls)))
        return 10_000_000

    monkeypatch.setattr(build_module, "free_memory_bytes", free_memory_after_load)
    config = load_config(probe_config(tmp_path, memory_budget=0.5, dtype="bfloat16"))

    runner = build_runner(config)

    assert measured == [("cpu", [("cpu", torch.bfloat16)])]
    assert runner.plan.budget_bytes == 5_000_000 and runner.plan.dtype == "bfloat16"
    assert runner.pipeline.load_calls == [("cpu", torch.bfloat16)]
    assert frame_ids(run(runner, "a", 2)[1]) == [2, 3]  # bf16 K/V through the bf16 cache


def test_build_runner_wraps_a_failing_load(tmp_path, monkeypatch):
    def broken_load(self, device, dtype):
        raise OSError("weights.safetensors: no such file")

    config = load_config(probe_config(tmp_path))
    real_build = build_module.build_pipeline

    def build_with_broken_load(*args):
        pipeline = real_build(*args)
        monkeypatch.setattr(type(pipeline), "load", broken_load)
        return pipeline

    monkeypatch.setattr(build_module, "build_pipeline", build_with_broken_load)
    with pytest.raises(ardiff.PipelineError, match=r"load\('cpu', float32\) raised OSError"):
        build_runner(config)


def test_build_runner_refuses_a_budget_that_holds_no_session(tmp_path):
    with pytest.raises(ardiff.CapacityError, match="cannot hold one session"):
        build_runner(load_config(probe_config(tmp_path, memory_budget="1KiB")))


def test_warmup_on_a_closed_runner_raises_even_without_warmup_requests():
    runner = make_runner(probe.NoWarmupPipeline())
    runner.close()
    with pytest.raises(ardiff.SessionError, match="the runner is closed"):
        runner.warmup()

"""ardiff/bench as a library: arms alternate per block, ratios are paired, the reference loop
agrees with ardiff, and what a bench opens it closes, whatever happens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ardiff.bench import current_rss_bytes, run, run_bench
from ardiff.bench.references import NO_LOOP
from ardiff.bench.spread import Spread, paired_ratios
from ardiff.config.run import load_config

REPO = Path(__file__).resolve().parents[2]
TINY_DIT = REPO / "configs" / "tiny-dit.yaml"
DEFAULT = REPO / "configs" / "default.yaml"


class Boom(RuntimeError):
    pass


def test_run_bench_closes_its_runners_when_a_measurement_raises(monkeypatch):
    built = {}
    real_build = run._build_runners

    def keep(config, compiled, runners):
        why_not = real_build(config, compiled, runners)
        built.update(runners)
        return why_not

    def fail(*args, **kwargs):
        raise Boom("injected measurement fault")

    monkeypatch.setattr(run, "_build_runners", keep)
    monkeypatch.setattr(run, "_alternate", fail)
    with pytest.raises(Boom):
        run_bench(load_config(TINY_DIT), blocks=1, repeats=1, encode=False, compiled=False)
    assert {"paged", "dense"} <= set(built)
    for runner in built.values():
        with pytest.raises(Exception, match="the runner is closed"):
            runner.warmup()


class Recorder:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def open(self, tag: str) -> None:
        self.calls.append(f"open {self.name}")

    def step(self) -> None:
        self.calls.append(self.name)


def test_arms_alternate_block_by_block_rotating_and_reversing():
    calls: list[str] = []
    arms = [Recorder(name, calls) for name in "abc"]
    run._alternate(arms, blocks=3, rep=1)  # repeat 1 goes on where repeat 0 stopped (step 3)

    assert calls == ["open a", "open b", "open c", "a", "c", "b", "c", "a", "b", "b", "a", "c"]


def test_over_a_cycle_every_arm_runs_first_equally_often_and_follows_every_other():
    arms = ["paged", "dense", "reference", "compiled"]
    orders = [run.block_order(arms, step) for step in range(2 * len(arms))]
    firsts = [order[0] for order in orders]
    assert sorted(firsts) == sorted(arms * 2)
    follows = {(order[k], order[k + 1]) for order in orders for k in range(len(arms) - 1)}
    assert {pair for pair in follows if pair[1] == "paged"} == {
        ("dense", "paged"), ("compiled", "paged")}   # a cyclic order had only compiled


def test_paired_ratios_and_their_spread_by_hand():
    ratios = paired_ratios([2.0, 3.0, 4.0, 10.0], [1.0, 3.0, 2.0, 5.0])
    assert ratios == [2.0, 1.0, 2.0, 2.0]
    assert Spread.of(ratios) == Spread(median=2.0, p10=1.3, p90=2.0, n=4)
    assert Spread.of([]) is None
    with pytest.raises(ValueError, match="ran 2 and 1 blocks"):
        paired_ratios([1.0, 2.0], [1.0])


def test_the_default_model_is_measured_against_its_hand_written_loop():
    report = run_bench(load_config(DEFAULT), blocks=2, repeats=1, encode=False, compiled=False)
    data = report.to_dict()

    assert set(data["arms"]) == {"paged", "dense", "reference"}
    assert data["max_abs_frame_diff"]["ardiff/reference"] == 0  # the same frames, bit for bit
    assert data["max_abs_frame_diff"]["paged/dense"] == 0
    ratio = data["ratios"]["ardiff/reference"]
    assert ratio["wall"]["n"] == ratio["cpu"]["n"] == 2 and ratio["wall"]["median"] > 0
    assert data["machine"]["torch_threads"] == 1 and len(data["machine"]["load_before"]) == 3
    assert data["ratios"]["eager/compiled"] is None and data["compile_s"] is None


def test_the_compiled_arm_runs_on_its_own_copy_of_the_pipeline(monkeypatch):
    """Plumbing only (torch.compile stubbed to return the function as it is): compiling
    for real takes seconds and is tested beside ardiff::paged_attend (tests/kv)."""
    compiled_pipelines = []

    def compile_stub(fn, **kwargs):
        compiled_pipelines.append(getattr(fn, "__self__", None))
        return fn

    monkeypatch.setattr(torch, "compile", compile_stub)
    report = run_bench(load_config(TINY_DIT), blocks=2, repeats=1, encode=False)
    data = report.to_dict()

    assert data["ratios"]["eager/compiled"]["wall"]["n"] == 2 and "compiled" not in data[
        "unavailable"]
    assert data["max_abs_frame_diff"]["eager/compiled"] == 0
    assert isinstance(data["compile_s"], float)
    eager_model = report.arms["paged"].runner.pipeline.model
    assert compiled_pipelines and eager_model not in compiled_pipelines


def test_the_tiny_dit_is_measured_against_its_loop_too():
    data = run_bench(load_config(TINY_DIT), blocks=1, repeats=1, encode=False,
                     compiled=False).to_dict()
    assert data["max_abs_frame_diff"]["ardiff/reference"] == 0
    assert data["unavailable"] == {"compiled": "not asked for (--no-compile)"}


def test_a_pipeline_without_a_loop_says_so(write_config):
    config = write_config("""
        pipeline:
          entry: ardiff.pipelines.synthetic:SyntheticAttention
          args: {num_layers: 1, num_kv_heads: 1, head_size: 8, tokens_per_frame: 4,
                 frames_per_block: 2, window_frames: 4}
        runtime: {memory_budget: 16MiB}
        """)
    data = run_bench(load_config(config), blocks=1, repeats=1, encode=False).to_dict()
    assert data["unavailable"] == {"reference": NO_LOOP, "compiled": run.NO_COMPILE_LAYERS}
    assert data["ratios"]["ardiff/reference"] is None and "reference" not in data["arms"]


def test_current_rss_is_a_whole_number_of_pages():
    assert current_rss_bytes() % os.sysconf("SC_PAGE_SIZE") == 0
    assert current_rss_bytes() > 0


def test_a_compiled_arm_that_fails_to_compile_is_reported_and_the_rest_is_measured(monkeypatch):
    real_build = run._build_runners
    failed = []

    def with_a_failing_compiled_runner(resolved, compiled, runners):
        real_build(resolved, False, runners)
        runner = runners["compiled"] = run.build_runner(resolved.config, backend="paged")

        def warmup():
            failed.append(runner)
            raise Boom("LoweringException: " + "x" * 500)

        runner.warmup = warmup
        return None

    monkeypatch.setattr(run, "_build_runners", with_a_failing_compiled_runner)
    data = run_bench(load_config(TINY_DIT), blocks=1, repeats=1, encode=False).to_dict()

    assert data["unavailable"]["compiled"].startswith("failed: Boom: LoweringException: xxx")
    assert len(data["unavailable"]["compiled"]) < 200 and "compiled" not in data["arms"]
    assert data["ratios"]["paged/dense"]["wall"]["n"] == 1 and data["compile_s"] is None
    assert failed[0]._closed  # the failed runner was closed at once

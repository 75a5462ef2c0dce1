"""Memory the device does not have is refused with exit 3 before anything is allocated, and
a plan of millions of pages costs no Python objects per page."""

from __future__ import annotations

import tracemalloc

import yaml
from typer.testing import CliRunner

from ardiff.config.run import build_config
from ardiff.engine import build
from ardiff.engine.build import build_runner
from ardiff.sizes import MAX_BUDGET_BYTES
from ardiff_cli.main import app

GiB = 2**30
# 46 TiB of KV for one session: the plan accepts it under a 1 PB budget, no machine has it.
HUGE = {"pipeline": {"entry": "ardiff.pipelines.synthetic:SyntheticAttention",
                     "args": {"num_layers": 64, "num_kv_heads": 64, "head_size": 256,
                              "tokens_per_frame": 100000, "frames_per_block": 3,
                              "window_frames": 60, "session_capacity": 1}},
        "runtime": {"memory_budget": 10**15}}
# A spec that allows a billion sessions of 12 tiny pages each (64 bytes a page).
MANY_SESSIONS = {"pipeline": {"entry": "ardiff.pipelines.synthetic:SyntheticAttention",
                              "args": {"num_layers": 1, "num_kv_heads": 1, "head_size": 8,
                                       "tokens_per_frame": 1, "frames_per_block": 3,
                                       "window_frames": 15, "session_capacity": 10**9}},
                 "runtime": {"memory_budget": "256MiB"}}


def warmup(tmp_path, config: dict):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return CliRunner().invoke(app, ["warmup", str(path)])


def test_a_budget_above_free_memory_is_refused_before_allocation(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "free_memory_bytes", lambda device: 8 * GiB + 123)
    monkeypatch.setattr(build, "_allocate", lambda *args: (_ for _ in ()).throw(
        AssertionError("allocated")))
    result = warmup(tmp_path, {**HUGE, "runtime": {"memory_budget": "12GiB"}})
    assert result.exit_code == 3, result.output
    assert result.stderr == ("error: runtime.memory_budget: 12GiB is more than the 8.0GiB free "
                             "on cpu; lower runtime.memory_budget to at most 8.0GiB or give a "
                             "fraction of free memory like 0.8\n")


def test_the_free_memory_in_the_message_is_rounded_down():
    """A user who copies the limit gets a budget that fits."""
    config = build_config({**HUGE, "runtime": {"memory_budget": 10 * GiB}})
    try:
        build.check_budget_fits(config.runtime.memory_budget, int(9.99 * GiB), "cuda:0")
    except build.CapacityError as exc:
        assert "more than the 9.9GiB free on cuda:0; lower runtime.memory_budget to at most " \
               "9.9GiB" in str(exc)
    else:
        raise AssertionError("not refused")


def test_a_budget_the_device_has_passes():
    config = build_config({**HUGE, "runtime": {"memory_budget": 8 * GiB}})
    build.check_budget_fits(config.runtime.memory_budget, 8 * GiB, "cpu")  # equal: fits
    fraction = build_config({**HUGE, "runtime": {"memory_budget": 1.0}}).runtime.memory_budget
    build.check_budget_fits(fraction, 1, "cpu")  # a fraction always fits


def test_the_default_huge_budget_fails_on_this_machine(tmp_path):
    """10**15 bytes is a budget ardiff accepts, and more than any machine here has."""
    result = warmup(tmp_path, HUGE)
    assert result.exit_code == 3
    assert result.stderr.startswith("error: runtime.memory_budget: 909TiB is more than the ")
    assert "free on cpu; lower runtime.memory_budget to at most" in result.stderr


def test_an_allocation_the_machine_refuses_is_a_capacity_error(tmp_path, monkeypatch):
    """If the device says it has the memory but the allocator fails, still exit 3."""
    monkeypatch.setattr(build, "free_memory_bytes", lambda device: MAX_BUDGET_BYTES)
    result = warmup(tmp_path, HUGE)
    assert result.exit_code == 3
    assert ("error: runtime.memory_budget: allocating the KV cache (46TiB for 1 session(s)) on "
            "cpu failed") in result.stderr
    assert "lower runtime.memory_budget" in result.stderr


def test_a_plan_of_millions_of_pages_makes_no_python_object_per_page():
    """session_capacity = 10**9: the budget caps the plan at ~350,000 sessions (4.2 million
    pages). Before, the pool built a list of 4.2 million ints (~160 MiB) here."""
    config = build_config(MANY_SESSIONS)
    tracemalloc.start()
    try:
        runner = build_runner(config)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert runner.plan.total_pages > 4_000_000
        assert runner.plan.session_capacity < 10**9
        assert peak < 1_000_000  # bytes of Python objects (torch's storage is not traced)
    finally:
        runner.close()

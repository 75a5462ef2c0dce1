"""`ardiff bench`: the numbers it prints come from real side-by-side runs.

Bench times the start-up of ten fresh `ardiff` processes (seconds on two cores): the
in-process runs record which command lines it would time instead, and one slow test times
the installed command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from extras import require_extra
from typer.testing import CliRunner

from ardiff_cli.bench import startup_seconds
from ardiff_cli.main import app

STARTUP_S = {"wall": [0.25, 0.2, 0.3], "cpu": [0.2, 0.2, 0.2]}  # recorded start-up timings

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

    def record(args: list[str]) -> dict[str, list[float]]:
        timed.append(args)
        return STARTUP_S

    monkeypatch.setattr("ardiff_cli.bench.startup_seconds", record)
    return timed


def test_bench_json_has_paired_ratios_equal_frames_and_exact_paged_bytes(tmp_path,
                                                                         timed_commands):
    result = run_bench(tmp_path, "--sweep-frames", "8,40", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    paged, dense = data["arms"]["paged"], data["arms"]["dense"]
    for arm in (paged, dense):  # 2 repeats x 2 blocks, wall and model-thread CPU
        assert arm["wall_s"]["n"] == arm["cpu_s"]["n"] == 4 and arm["wall_s"]["median"] > 0
        assert len(arm["blocks"]["wall_s"]) == len(arm["blocks"]["cpu_s"]) == 4  # per block
        assert min(arm["blocks"]["wall_s"]) > 0
    ratio = data["ratios"]["paged/dense"]["wall"]
    assert ratio["n"] == 4 and ratio["p10"] <= ratio["median"] <= ratio["p90"]
    assert data["max_abs_frame_diff"]["paged/dense"] <= 1
    assert paged["kv_bytes_vs_plan_min"] == 1.0
    encode = data["encode"]
    assert 0 < encode["share"]["median"] and encode["share"]["n"] == 2
    assert encode["frames"] == 2 * 32 * 2 and encode["bytes_per_frame"] > 0  # 32 blocks of 2
    assert [p["frames"] for p in data["sweep"]] == [8, 40]
    assert data["startup_s"]["help"]["wall"] == pytest.approx(
        {"median": 0.25, "p10": 0.21, "p90": 0.29, "n": 3})
    assert data["startup_s"]["help"]["cpu"]["median"] == pytest.approx(0.2)
    assert data["machine"]["torch_threads"] == 1
    assert data["machine"]["cpu_model"] and data["machine"]["cpu_capability"]
    assert timed_commands == [["--help"], ["inspect-spec", str(tmp_path / "bench.yaml")]]
    # The window bounds the pages whatever the length: history + one block in flight.
    assert data["sweep"][0]["pages_in_use_max"] == data["sweep"][1]["pages_in_use_max"]


def test_bench_table_prints_measurements_and_no_encode_skips_the_encode_runs(tmp_path,
                                                                             timed_commands):
    """Measurements only (#35): no targets, no met/MISSED; a header on every column; the
    machine (CPU model, torch's CPU capability) in the title; within 100 columns."""
    result = run_bench(tmp_path, "--no-encode")
    assert result.exit_code == 0, result.output
    assert "paged / dense (wall)" in result.stdout
    assert not any(word in result.stdout for word in ("<= 1.03", "MISSED", " met ", "target"))
    assert "measure" in result.stdout and "p10-p90" in result.stdout
    assert "torch CPU capability" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 100
    assert "paged / dense (CPU)" in result.stdout
    assert "ardiff / reference loop" in result.stdout and "hand-written" in result.stdout
    assert "compile_layers" in result.stdout  # the synthetic pipeline cannot be compiled
    assert "encode share" not in result.stdout
    assert "start-up" in result.stdout and "250.0 ms" in result.stdout


def test_markdown_prints_a_table_to_paste_with_the_load_it_ran_under(tmp_path,
                                                                     timed_commands):
    result = run_bench(tmp_path, "--no-encode", "--no-compile", "--markdown")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "load average" in lines[0] and "1 torch thread" in lines[0]
    assert lines[2] == "| measure | median | p10-p90 |"
    assert any(line.startswith("| paged / dense (wall) | ") for line in lines)
    assert any(line.startswith("| eager / compiled | - (not asked for") for line in lines)


def test_a_bad_sweep_is_a_usage_error(tmp_path):
    result = run_bench(tmp_path, "--sweep-frames", "100,x")
    assert result.exit_code == 2
    assert "positive frame counts" in result.output


@pytest.mark.slow
def test_startup_seconds_times_the_installed_command():
    seconds = startup_seconds(["--help"], runs=2)
    assert seconds is not None, "no ardiff command is installed"
    assert len(seconds["wall"]) == len(seconds["cpu"]) == 2
    assert min(seconds["wall"]) > 0 and min(seconds["cpu"]) > 0


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


def test_no_config_benches_the_embedded_default_against_its_reference_loop(timed_commands):
    result = CliRunner().invoke(app, ["bench", "--blocks", "1", "--repeats", "1", "--no-encode",
                                      "--no-compile", "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["ratios"]["ardiff/reference"]["wall"]["n"] == 1
    assert data["max_abs_frame_diff"]["ardiff/reference"] == 0
    assert timed_commands[1][0] == "inspect-spec"
    assert Path(timed_commands[1][1]).name == "default.yaml"


# -- #25: limits like rollout's, stdout the JSON's alone ------------------------------------------
FAULTS = Path(__file__).resolve().parents[1] / "support" / "fault_pipelines.py"
SHORT = {"pipeline": {"entry": f"{FAULTS}:FaultPipeline", "args": {"max_model_len": 40}},
         "runtime": {"memory_budget": "16MiB"}, "rollout": {"frames": 4},
         "output": {"fps": 8}}  # blocks of 2 frames; 4 blocks fill the window


@pytest.mark.parametrize("args, message", [
    (["--blocks", "0"], "--blocks: 0 is invalid; it must be > 0"),
    (["--repeats", "1001"], "--repeats: 1001 is invalid; it must be <= 1000"),
    (["--sweep-frames", "8,1000001"], "--sweep-frames: 1000001 is invalid; it must be <= "
                                      "1000000"),
    (["--blocks", "17", "--no-encode"], "--blocks: 17 timed blocks after the 4 that fill the "
     "window reach frame position 42, past the pipeline's max_model_len of 40; use --blocks "
     "16 at most"),
    (["--blocks", "2"], "--blocks: the encode runs make 32 blocks after the 4 that fill the "
     "window, reaching frame position 72, past the pipeline's max_model_len of 40; add "
     "--no-encode"),
    (["--sweep-frames", "8,41", "--no-encode"], "--sweep-frames: 41 frames reach frame "
     "position 42, past the pipeline's max_model_len of 40; use at most 40"),
    (["--workers", "2000"], "runtime.parallel.workers: 2000 is invalid; it must be <= 1024"),
    (["--workers", "2"], "runtime.parallel.workers: 2 replicas for 1 prompt(s) would leave 1 "
     "idle; use at most 1 (or give more prompts)"),
])
def test_lengths_and_counts_are_refused_before_anything_loads(tmp_path, monkeypatch, args,
                                                              message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the bench built a runner before its lengths were checked")

    monkeypatch.setattr("ardiff.bench.run.build_runner", must_not_run)
    monkeypatch.setattr("ardiff.bench.speedup.run_parallel_rollout", must_not_run)
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump(SHORT))

    result = CliRunner().invoke(app, ["bench", str(config), *args, "--json", "bench.json"])

    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {message}"]
    assert not (tmp_path / "bench.json").exists()


def test_actions_are_checked_as_a_rollout_checks_them(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the bench built a runner before its actions were checked")

    monkeypatch.setattr("ardiff.bench.run.build_runner", must_not_run)
    result = CliRunner().invoke(app, ["bench", "--set", "rollout.actions=[left, jump]"])

    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: rollout.actions[1]: 'jump' is not an action of this pipeline; use one of none, "
        "left, right, up, down"]


def test_a_plot_that_cannot_be_written_is_exit_1_after_the_numbers(tmp_path, monkeypatch,
                                                                   timed_commands):
    require_extra("plot")
    from ardiff.errors import OutputPathError

    def disk_full(timeline, path, *args):
        raise OutputPathError(f"cannot write the picture {str(path)!r} (OSError: No space left "
                              f"on device); choose a writable path")

    monkeypatch.setattr("ardiff.rollout.figure.write_figure", disk_full)
    plot = tmp_path / "run.png"
    result = run_bench(tmp_path, "--no-encode", "--no-compile", "--plot", str(plot),
                       "--json", str(tmp_path / "bench.json"))

    assert result.exit_code == 1, result.output
    assert "paged / dense" in result.stdout
    assert result.stderr.splitlines()[-1] == (
        f"error: cannot write the picture {str(plot)!r} (OSError: No space left on device); "
        f"choose a writable path")
    assert json.loads((tmp_path / "bench.json").read_text())["plot"]["error"]


PRINTING = """
from fault_pipelines import FaultPipeline


class Printing(FaultPipeline):
    def generate_block(self, request, state):
        print("a pipeline's print")
        return super().generate_block(request, state)
"""


def test_json_dash_stdout_holds_the_json_alone(tmp_path, timed_commands):
    (tmp_path / "printing.py").write_text(PRINTING)
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({**SHORT, "pipeline": {"entry": "printing.py:Printing"}}))

    result = CliRunner().invoke(app, ["bench", str(config), "--blocks", "1", "--repeats", "1",
                                      "--no-encode", "--no-compile", "--json", "-"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["arms"]["paged"]["wall_s"]["n"] == 1  # all of stdout
    assert "a pipeline's print" in result.stderr


@pytest.mark.heavy  # the whole bench in a subprocess, its start-up timing included
def test_json_dash_of_the_installed_command_holds_the_json_alone(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    ardiff = shutil.which("ardiff", path=str(Path(sys.executable).parent))
    (tmp_path / "printing.py").write_text(PRINTING.replace(
        'print("a pipeline\'s print")', 'print("a pipeline\'s print"); '
        '__import__("os").write(1, b"a write to fd 1\\n")'))
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({**SHORT, "pipeline": {"entry": "printing.py:Printing"}}))
    env = {**os.environ, "PYTHONPATH": str(FAULTS.parent), "OMP_NUM_THREADS": "1"}

    proc = subprocess.run([ardiff, "bench", str(config), "--blocks", "1", "--repeats", "1",
                           "--no-encode", "--no-compile", "--json", "-"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["arms"]["paged"]["wall_s"]["n"] == 1
    assert "a pipeline's print" in proc.stderr and "a write to fd 1" in proc.stderr

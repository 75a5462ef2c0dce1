"""`ardiff bench --batch`: B sessions per forward, side by side, from real runs.

A tiny attention-only pipeline whose `generate_blocks` attends every row in one batched
attend (its frames equal the one-session forward's); one that mixes its rows up shows that
the frame check is real; the synthetic pipeline without `generate_blocks` runs one session
per forward and says so. Speed is not asserted (docs/performance.md holds the numbers)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from ardiff.bench.arms import Times
from ardiff.bench.batch import BatchArm, BatchBenchReport, run_batch_bench
from ardiff.config.run import load_config
from ardiff.errors import CapacityError, ConfigError
from ardiff_cli.main import app

BATCHED = '''
import torch

import ardiff
from ardiff.pipelines.shared.sampling import block_generator
from ardiff.pipelines.synthetic import SyntheticAttention


class Batched(SyntheticAttention):
    """generate_block's draws per row; every probe and the commit one batched attend."""

    mix_rows = False

    def generate_blocks(self, requests, states):
        s = self.spec
        tokens = s.frames_per_block * s.tokens_per_frame
        q_tokens = int(requests[0].extra.get("q_tokens", tokens))
        drawn = []
        for request, state in zip(requests, states):
            seed = requests[0].seed if self.mix_rows else request.seed
            generator = block_generator(seed, state.num_committed_frames("main"))
            drawn.append([torch.randn(n, s.num_kv_heads, s.head_size, generator=generator)
                          for n in (q_tokens, tokens, tokens)])
        q, k, v = (torch.stack([row[i] for row in drawn]) for i in range(3))
        for step in range(self.num_steps + 1):
            with states.block("main", commit=step == self.num_steps) as blk:
                for layer in range(s.num_layers):
                    out = blk.attend(layer, q, k, v)
        return [ardiff.BlockOutput(frames=self._frames(row)) for row in out]


class Mixed(Batched):
    mix_rows = True  # every row draws row 0's noise: rows 1.. differ from running alone
'''
GEOMETRY = {"num_layers": 1, "num_kv_heads": 1, "head_size": 8, "tokens_per_frame": 4,
            "frames_per_block": 2, "window_frames": 4, "sink_frames": 1,
            "session_capacity": 4}


def config_file(tmp_path, entry: str = "batched.py:Batched", budget: str = "16MiB"):
    (tmp_path / "batched.py").write_text(BATCHED)
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline": {"entry": entry, "args": GEOMETRY},
        "runtime": {"memory_budget": budget}, "output": {"fps": 8}}))
    return path


def test_every_size_runs_its_sessions_in_one_forward_with_the_frames_of_running_alone(
        tmp_path):
    config = load_config(config_file(tmp_path))
    data = run_batch_bench(config, [2, 4], blocks=2, repeats=2).to_dict()

    assert data["mode"] == "batch" and data["batched"] and data["notice"] is None
    sizes = {size["batch"]: size for size in data["sizes"]}
    assert list(sizes) == [1, 2, 4]  # B=1, the baseline, is added
    for b, size in sizes.items():
        assert size["forwards"] == {str(b): 4}  # 2 repeats x 2 blocks, all rows at once
        assert size["frames"] == 4 * b * 2  # frames_per_block 2
        assert size["block_wall_s"]["n"] == size["frames_per_s"]["n"] == 4
        assert size["speedup"]["wall"]["n"] == size["speedup"]["cpu"]["n"] == 4
        assert 0 < size["pages_in_use_max"] <= size["pages_total"]
    assert sizes[1]["max_abs_frame_diff"] is None
    assert sizes[2]["max_abs_frame_diff"] == sizes[4]["max_abs_frame_diff"] == 0
    assert (sizes[2]["rows_checked"], sizes[4]["rows_checked"]) == (2, 4)
    assert sizes[1]["speedup"]["wall"]["median"] == 1.0
    # More sessions hold more pages: the history of each, one block in flight per row.
    assert sizes[1]["pages_in_use_max"] < sizes[2]["pages_in_use_max"] < \
        sizes[4]["pages_in_use_max"]


def test_rows_that_mix_their_sessions_up_show_in_the_frame_difference(tmp_path):
    config = load_config(config_file(tmp_path, "batched.py:Mixed"))
    data = run_batch_bench(config, [1, 2], blocks=1, repeats=1).to_dict()

    assert data["sizes"][1]["max_abs_frame_diff"] > 0


def test_a_pipeline_without_generate_blocks_runs_one_session_per_forward(tmp_path):
    config = load_config(config_file(tmp_path, "ardiff.pipelines.synthetic:SyntheticAttention"))
    data = run_batch_bench(config, [2], blocks=1, repeats=1).to_dict()

    assert not data["batched"] and "one per forward" in data["notice"]
    assert data["sizes"][1]["forwards"] == {"1": 2}
    assert data["sizes"][1]["max_abs_frame_diff"] == 0


def test_speedup_is_paired_per_step_on_the_time_per_frame():
    def arm(size: int, wall: list[float]) -> BatchArm:
        a = BatchArm(size, runner=None, config=None, fill=0,  # type: ignore[arg-type]
                     times=Times(wall_s=wall, cpu_s=wall))
        a.frames_made = [2 * size] * len(wall)
        return a

    report = BatchBenchReport(2, 1, 1, "p", True, {1: arm(1, [1.0, 2.0]),
                                                    4: arm(4, [2.0, 2.0])})
    spread = report.speedup(4)
    assert spread is not None and spread.n == 2
    assert sorted([spread.p10, spread.p90]) == pytest.approx([2.2, 3.8])  # 2.0 and 4.0
    assert spread.median == pytest.approx(3.0)


@pytest.mark.parametrize("sizes, error, message", [
    ([1, 8], ConfigError, "--batch: 8 sessions at once, but the pipeline's spec holds at most "
     "4 resident (its session_capacity); use batch sizes up to 4, or raise it where the "
     "pipeline takes it (e.g. --set pipeline.args.session_capacity=8)"),
    ([4], CapacityError, "--batch: 4 sessions in one forward, but runtime.memory_budget "
     "(3.0KiB) holds 2 with their blocks in flight; use smaller batch sizes, or raise "
     "runtime.memory_budget"),
])
def test_sizes_the_pipeline_or_the_budget_cannot_hold_are_refused(tmp_path, sizes, error,
                                                                  message):
    config = load_config(config_file(tmp_path, budget="3KiB"))
    with pytest.raises(error) as raised:
        run_batch_bench(config, sizes, blocks=1, repeats=1)
    assert str(raised.value) == message


def test_the_cli_prints_a_row_per_size_and_the_json(tmp_path):
    config = config_file(tmp_path)
    result = CliRunner().invoke(app, ["bench", str(config), "--batch", "1,2", "--blocks", "1",
                                      "--repeats", "1", "--markdown", "--json",
                                      str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "--batch: 1 repeats x 1 blocks per batch size" in lines[0]
    assert lines[2].startswith("| B | forwards | latency | frames/s |")
    assert lines[4].startswith("| 1 | 1 | ") and lines[5].startswith("| 2 | 2 | ")
    assert "| 0 (2/2 rows) |" in lines[5]
    data = json.loads((tmp_path / "b.json").read_text())
    assert [size["batch"] for size in data["sizes"]] == [1, 2]
    blocks = data["sizes"][1]["blocks"]  # per timed block: its wall and CPU seconds, frames
    assert len(blocks["wall_s"]) == len(blocks["cpu_s"]) == len(blocks["frames"]) == 1


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "error: --batch: 0 is invalid; it must be > 0"),
    (["--batch", "1,2,2"], "error: --batch: 2 is given twice; give each batch size once, like "
                           "1,2,4,8"),
    (["--batch", "1,2", "--workers", "2"], "error: --batch: cannot be combined with --workers; "
     "it measures batch sizes alone: run --workers as another bench"),
])
def test_bad_sizes_are_one_line_before_anything_loads(tmp_path, monkeypatch, args, message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the bench built a runner before --batch was checked")

    monkeypatch.setattr("ardiff.bench.batch.build_runner", must_not_run)
    result = CliRunner().invoke(app, ["bench", str(config_file(tmp_path)), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [message]


def test_sizes_that_are_not_numbers_are_a_usage_error(tmp_path):
    result = CliRunner().invoke(app, ["bench", str(config_file(tmp_path)), "--batch", "1,x"])
    assert result.exit_code == 2
    assert "positive batch sizes like 1,2,4,8" in result.output


# -- benchmarks/gpu_batch.py (what benchmarks/gpu.sh runs on a GPU), tiny on the CPU ---------
def gpu_batch():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_batch.py"
    spec = importlib.util.spec_from_file_location("gpu_batch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_batch"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_gpu_script_runs_every_path_tiny_on_the_cpu_with_equal_outputs(tmp_path):
    assert gpu_batch().main(["--device", "cpu", "--tiny", "--no-compile", "--batch", "1,2",
                             "--repeats", "3", "--warmup", "0", "--out", str(tmp_path)]) == 0

    data = json.loads((tmp_path / "gpu_batch.json").read_text())
    arms = {(a["path"], a["batch"]): a for a in data["arms"]}
    assert sorted(arms) == [(path, b) for path in ("batched", "dense", "paged") for b in (1, 2)]
    for arm in arms.values():
        assert arm["block_s"]["n"] == 3 and arm["frames_per_s"] > 0
        assert arm["max_abs_diff_vs_dense_eager"] <= 1e-6  # fp32: the same sums
        assert arm["peak_bytes"] is None  # device memory is CUDA's alone
    assert data["machine"]["kernel"] == "sdpa" and data["geometry"]["layers"] == 2
    table = (tmp_path / "gpu_batch.md").read_text().splitlines()
    assert table[2].startswith("| B | path | mode | block latency")
    assert len(table) == 4 + len(arms)


def test_the_gpu_script_without_a_gpu_fails_loudly(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exited:
        gpu_batch().main(["--out", str(tmp_path)])
    assert "torch sees no CUDA device" in str(exited.value.code)
    assert not (tmp_path / "gpu_batch.json").exists()


@pytest.mark.heavy  # torch.compile traces every path (its eager backend: no Inductor)
def test_the_gpu_script_compiles_every_path(tmp_path):
    assert gpu_batch().main(["--device", "cpu", "--tiny", "--batch", "1,2", "--repeats", "3",
                             "--compile-backend", "eager", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_batch.json").read_text())
    compiled = [a for a in data["arms"] if a["mode"] == "compiled"]
    assert len(compiled) == 6
    assert all(a["max_abs_diff_vs_dense_eager"] <= 1e-5 for a in compiled)

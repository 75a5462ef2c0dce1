"""Parallel jobs end to end on the CPU with gloo (`runtime.parallel`, ardiff.launch).

Each scenario is one module-scoped run (a rank costs seconds of torch import) that many
tests read: data-parallel against one process, CFG-parallel against one process, a
fault on rank 1, a stuck rank (their parents run in this process, through the library),
Ctrl-C and torchrun's ranks against spawned ones (through the installed command).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from ardiff.config.run import load_config
from ardiff.engine.build import inspect_spec
from ardiff.launch.job import run_job as run_rollout
from ardiff.rollout.report import STATS_SCHEMA

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).parents[1] / "support"
BIN = Path(sys.executable).parent
PROMPTS = ["a red ball", "a blue cube", "a green cone", "a cat"]
TINY = {"frames_per_block": 3, "window_frames": 6, "sink_frames": 1, "dim": 32,
        "num_layers": 1, "latent_size": 8, "upscale": 2}


def write_config(folder: Path, *, cfg: bool = False, parallel: dict | None = None,
                 entry: str = "ardiff.pipelines.tiny_dit:TinyCausalDiT", frames: int = 12,
                 out: str = "v.npy", **args) -> Path:
    rollout = {"frames": frames, "prompts": "prompts.txt"}
    if cfg:
        rollout = {"frames": frames, "guidance_scale": 3.0, "negative_prompt": "blurry"}
    config = {"pipeline": {"entry": entry, "args": {**TINY, "cfg": cfg, **args}},
              "runtime": {"memory_budget": "32MiB", "parallel": parallel or {}},
              "rollout": rollout, "output": {"path": str(folder / out)}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    path = folder / "run.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def run_job(config: Path, *overrides: str) -> int:
    """`ardiff rollout CONFIG --json stats.json` with the parent in this process (the ranks
    are spawned): the exit code; the stats are beside the config."""
    report = run_rollout(load_config(config, list(overrides)))
    (config.parent / "stats.json").write_text(json.dumps(report.to_dict()))
    return report.exit_code


def one_process(config: Path) -> list[np.ndarray]:
    report = run_rollout(load_config(config))
    assert report.status == "ok", report.error
    return [np.load(o.path) for o in report.outputs]


def stats(folder: Path) -> dict:
    data = json.loads((folder / "stats.json").read_text())
    jsonschema.validate(data, STATS_SCHEMA)
    return data


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended too
        return stat.read().split(")")[-1].split()[0] != "Z"


def assert_clean_end(data: dict) -> None:
    """Every rank gave back every page and no rank process outlived the job."""
    for rank in data["ranks"]:
        assert rank["pid"] != os.getpid()
        assert not is_alive(rank["pid"]), f"rank {rank['rank']} outlived the job"
        if rank["kv"]:
            assert rank["kv"]["pages_in_use"] == 0


# -- data parallel ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dp")
    single = one_process(write_config(folder / "one"))
    config = write_config(folder / "two")
    code = run_job(config, "runtime.parallel.workers=2", "runtime.parallel.threads=1")
    return folder, single, config, code


def test_two_workers_make_the_same_four_videos_in_stream_order(data_parallel):
    folder, single, config, code = data_parallel
    assert code == 0
    data = stats(config.parent)
    assert [Path(o["path"]).name for o in data["outputs"]] == [f"v-{i}.npy" for i in range(4)]
    assert [o["prompt"] for o in data["outputs"]] == PROMPTS
    for i, frames in enumerate(single):
        assert np.array_equal(np.load(config.parent / f"v-{i}.npy"), frames), f"stream {i}"


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("dp3"))
    return config, run_job(config, "runtime.parallel.workers=3", "runtime.parallel.threads=1")


def test_three_workers_make_the_same_four_videos(data_parallel, three_workers):
    single, (config, code) = data_parallel[1], three_workers
    assert code == 0
    data = stats(config.parent)
    assert [r["streams"] for r in data["ranks"]] == [[0, 3], [1], [2]]
    for i, frames in enumerate(single):   # seeds depend on the stream, never on the rank
        assert np.array_equal(np.load(config.parent / f"v-{i}.npy"), frames), f"stream {i}"
    assert_clean_end(data)


def test_each_replica_runs_every_other_stream_on_its_own_process(data_parallel):
    data = stats(data_parallel[2].parent)
    ranks = data["ranks"]
    assert [r["streams"] for r in ranks] == [[0, 2], [1, 3]]
    assert len({r["pid"] for r in ranks}) == 2
    assert [r["status"] for r in ranks] == ["ok", "ok"]
    assert [r["frames_written"] for r in ranks] == [24, 24]
    assert data["parallel"] == {"workers": 2, "cfg": 1, "world_size": 2, "launcher": "spawn",
                                "backend": "gloo", "threads_per_rank": 1, "timeout_s": 600.0}


def test_job_totals_add_up_the_ranks(data_parallel):
    data = stats(data_parallel[2].parent)
    assert data["status"] == "ok" and data["exit_code"] == 0
    assert data["frames"]["requested"] == data["frames"]["written"] == 48
    assert data["sessions"]["created"] == 4
    assert data["timing"]["blocks"] == 16
    assert data["kv"]["pages_total"] == sum(r["kv"]["pages_total"] for r in data["ranks"])
    assert_clean_end(data)


# -- CFG parallel -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cfg_parallel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cfg")
    single_config = write_config(folder / "one", cfg=True, frames=15)
    single = one_process(single_config)
    config = write_config(folder / "two", cfg=True, frames=15)
    code = run_job(config, "runtime.parallel.cfg=2")
    spec = inspect_spec(load_config(config, ["runtime.parallel.cfg=2"])).to_dict()
    single_spec = inspect_spec(load_config(single_config)).to_dict()
    return single, config, code, spec, single_spec


def test_cfg_parallel_frames_equal_one_process(cfg_parallel):
    single, config, code, *_ = cfg_parallel
    assert code == 0
    assert np.array_equal(np.load(config.parent / "v.npy"), single[0])


def test_cfg_parallel_holds_half_the_pages_per_rank(cfg_parallel):
    _, config, _, spec, single_spec = cfg_parallel
    data = stats(config.parent)
    assert [(r["replica"], r["cfg_rank"], r["streams"]) for r in data["ranks"]] == [
        (0, 0, [0]), (0, 1, [0])]
    one = single_spec["memory"]["total_pages"]
    assert [r["kv"]["pages_total"] for r in data["ranks"]] == [one // 2, one // 2]
    assert spec["memory"]["history_pages_per_session"] * 2 == \
        single_spec["memory"]["history_pages_per_session"]
    assert spec["parallel"]["ranks"] == 2
    assert spec["parallel"]["total_bytes"] == 2 * spec["memory"]["total_bytes"]
    assert_clean_end(data)


# -- failures -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rank_fault(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fault")
    config = write_config(folder, cfg=True, frames=30, parallel={"cfg": 2},
                          entry=f"{SUPPORT / 'rank_pipelines.py'}:RankFaultDiT", fault="raise",
                          on_rank=1, at_block=3)
    return folder, run_job(config)


def test_a_fault_on_rank_1_fails_the_job_and_names_the_rank(rank_fault):
    folder, code = rank_fault
    assert code == 1
    data = stats(folder)
    assert data["error"].startswith(
        "rank 1: session 'stream-0' block 3: generate_block raised RankFault")
    assert data["status"] == "failed" and data["exit_code"] == 1
    rank0, rank1 = data["ranks"]
    assert rank1["status"] == "failed"
    # Rank 0 either sees its CFG peer leave inside the all-gather, or (when it is between
    # blocks at that moment) takes the parent's stop at its next safe point: a race by design.
    assert rank0["status"] in ("failed", "interrupted")
    if rank0["status"] == "failed":
        assert "a peer of its CFG group left" in rank0["error"]


def test_a_failed_job_keeps_every_finished_frame_and_every_page(rank_fault):
    folder, _ = rank_fault
    assert np.load(folder / "v.npy").shape[0] == 9   # blocks 0, 1, 2 of 3 frames
    assert_clean_end(stats(folder))


@pytest.fixture(scope="module")
def stuck_rank(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stuck")
    config = write_config(folder, parallel={"workers": 2, "timeout_s": 2.0},
                          entry=f"{SUPPORT / 'rank_pipelines.py'}:RankFaultDiT", fault="hang",
                          on_rank=1, at_block=1)
    return folder, run_job(config)


def test_a_stuck_rank_fails_at_timeout_s_and_is_ended(stuck_rank):
    folder, code = stuck_rank
    assert code == 1
    data = stats(folder)
    assert data["error"].startswith("rank 1: no progress for 2 s in its rollout "
                                    "(runtime.parallel.timeout_s)")
    assert data["ranks"][0]["status"] == "ok"            # rank 0 finished its streams
    assert [Path(o["path"]).name for o in data["outputs"]] == ["v-0.npy", "v-2.npy"]
    assert np.load(folder / "v-1.npy").shape[0] == 3      # rank 1's block 0, finalised
    assert not list(folder.glob(".*partial*"))            # no work file left behind
    assert_clean_end(data)


# -- Ctrl-C -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sigint")
    marker = folder / "blocks"
    config = write_config(folder, frames=60, entry=f"{SUPPORT / 'rank_pipelines.py'}:RankFaultDiT",
                          block_sleep_s=0.2, marker=str(marker))
    proc = subprocess.Popen([str(BIN / "ardiff"), "rollout", str(config), "--workers", "2",
                             "--json", str(folder / "stats.json"), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a terminal's process group
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: every process of the group
    _, stderr = proc.communicate(timeout=120)
    return folder, proc.returncode, stderr


@pytest.mark.heavy  # the installed command, its own forkserver and ranks, then a real SIGINT
def test_ctrl_c_reaches_every_rank_and_leaves_playable_files(interrupted):
    folder, code, stderr = interrupted
    assert code == 130, stderr
    data = stats(folder)
    assert data["status"] == "interrupted" and data["error"] == "interrupted by SIGINT"
    assert {r["status"] for r in data["ranks"]} == {"interrupted"}
    assert len(data["outputs"]) == 2  # the stream each rank was on
    for output in data["outputs"]:
        frames = np.load(output["path"])
        assert 0 < frames.shape[0] < 60 and frames.shape[0] % 3 == 0
    assert_clean_end(data)


# -- torchrun -----------------------------------------------------------------------------

@pytest.mark.heavy  # torchrun, the installed command and two ranks: three fresh interpreters
@pytest.mark.skipif(shutil.which("torchrun", path=str(BIN)) is None, reason="no torchrun")
def test_torchrun_ranks_match_spawned_ones(data_parallel, tmp_path):
    _, single, config, _ = data_parallel
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", str(BIN / "ardiff"),
         "rollout", str(config), "-o", str(tmp_path / "t.npy"), "--json",
         str(tmp_path / "stats.json"), "-q", "--set", "runtime.parallel.launcher=env"],
        capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    for i, frames in enumerate(single):
        assert np.array_equal(np.load(tmp_path / f"t-{i}.npy"), frames), f"stream {i}"
    data = json.loads((tmp_path / "stats.json").read_text())
    jsonschema.validate(data, STATS_SCHEMA)
    assert data["parallel"]["launcher"] == "env"
    assert [r["streams"] for r in data["ranks"]] == [[0, 2], [1, 3]]

"""Several prompts per forward (`rollout.batch`, ardiff/rollout/batches.py): each prompt's
video equals the unbatched run's, the JSON says which batches ran, and failures, stops and
pipelines that cannot batch keep today's guarantees per stream.

The batch pipelines (tests/support/batch_pipelines.py) check every attend against the
frames their session should see; frame f of a video is filled with f.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from ardiff.config.run import build_config
from ardiff.errors import PipelineLoadError
from ardiff.rollout.job import run_rollout
from ardiff.rollout.report import STATS_SCHEMA, merge_batching
from ardiff.rollout.stop import RolloutStop

SUPPORT = Path(__file__).parents[1] / "support"
BATCH_FILE, PROBE_FILE = SUPPORT / "batch_pipelines.py", SUPPORT / "probe_pipeline.py"
FRAMES = 5  # blocks of 2 frames: 3 blocks, the last cut to 1 frame
ARDIFF = shutil.which("ardiff", path=str(Path(sys.executable).parent)) or shutil.which("ardiff")
TINY_DIT = Path(__file__).parents[2] / "configs" / "tiny-dit.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
    [str(SUPPORT), os.environ.get("PYTHONPATH", "")])}  # batch_pipelines imports probe_pipeline


def installed(*args: object) -> subprocess.CompletedProcess:
    """`ardiff ARGS` through the installed command, in a subprocess."""
    assert ARDIFF, "the ardiff command is not installed next to this Python"
    return subprocess.run([ARDIFF, *map(str, args)], env=ENV, capture_output=True, text=True,
                          timeout=300)


def make_config(tmp_path: Path, entry: str = "RowBatchProbe", args: dict | None = None,
                prompts: int = 4, runtime: dict | None = None, **rollout):
    file = PROBE_FILE if entry == "ProbePipeline" else BATCH_FILE
    if entry == "UpstreamStylePipeline":
        file = SUPPORT / "upstream_pipeline.py"
    data = {"pipeline": {"entry": f"{file}:{entry}", "args": args or {}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB", **(runtime or {})},
            "rollout": {"frames": FRAMES, "prompts": [f"p{i}" for i in range(prompts)],
                        **rollout},
            "output": {"path": str(tmp_path / "out-{index}.npy"), "fps": 8}}
    return build_config(data, base_dir=tmp_path)


def videos(tmp_path: Path, count: int) -> list[np.ndarray]:
    return [np.load(tmp_path / f"out-{i}.npy") for i in range(count)]


def first_pixels(video: np.ndarray) -> list[int]:
    return [int(frame[0, 0, 0]) for frame in video]


# -- equal to the unbatched run -------------------------------------------------------------
@pytest.mark.parametrize("entry", ["RowBatchProbe", "AttendBatchProbe"])
def test_a_batched_rollout_writes_every_prompts_video_as_the_unbatched_run(tmp_path, entry):
    (tmp_path / "one").mkdir()
    single = run_rollout(make_config(tmp_path / "one", entry, batch=1))
    report = run_rollout(make_config(tmp_path, entry, batch=2))

    assert (report.status, single.status) == ("ok", "ok")
    batched = videos(tmp_path, 4)
    for video, expected in zip(batched, videos(tmp_path / "one", 4)):
        np.testing.assert_array_equal(video, expected)
    assert first_pixels(batched[3]) == [0, 1, 2, 3, 4]
    record = report.to_dict()
    jsonschema.validate(record, STATS_SCHEMA)
    assert record["batching"]["batch"] == 2 and record["batching"]["requested"] == 2
    assert record["batching"]["forwards"] == {"2": 6}  # 2 pairs of prompts, 3 blocks each
    assert [(s["stream"], s["blocks"]) for s in record["batching"]["streams"]] == [
        (i, 3) for i in range(4)]
    assert single.to_dict()["batching"]["forwards"] == {"1": 12}
    assert record["timing"]["blocks"] == 12 and report.sessions["closed"] == 4
    assert report.kv["pages_in_use"] == 0


def test_auto_batches_every_prompt_up_to_the_pipelines_max_batch_size(tmp_path):
    report = run_rollout(make_config(tmp_path, args={"max_batch_size": 2}, prompts=3))

    batching = report.to_dict()["batching"]
    assert (batching["batch"], batching["requested"]) == (2, None)
    assert batching["forwards"] == {"1": 3, "2": 3}  # the third prompt runs alone after


def test_auto_batches_fewer_prompts_where_the_budget_holds_fewer_blocks_in_flight(tmp_path):
    # 16KiB holds one session and one block in flight of the probe, not 4 blocks in flight
    report = run_rollout(make_config(tmp_path, runtime={"memory_budget": "16KiB"}))

    assert report.status == "ok" and report.kv["session_capacity"] == 1
    assert report.to_dict()["batching"]["batch"] == 1


def test_interleaved_prompts_run_round_robin_in_batches(tmp_path):
    (tmp_path / "one").mkdir()
    single = run_rollout(make_config(tmp_path / "one", batch=1, prompts=3, interleave=True))
    report = run_rollout(make_config(tmp_path, batch=2, prompts=3, interleave=True))

    assert report.to_dict()["batching"]["forwards"] == {"1": 3, "2": 3}
    assert report.sessions["evicted"] == 0
    for video, expected in zip(videos(tmp_path, 3), videos(tmp_path / "one", 3)):
        np.testing.assert_array_equal(video, expected)
    assert single.status == "ok"


# -- pipelines that cannot batch -------------------------------------------------------------
@pytest.mark.parametrize("entry", ["ProbePipeline", "UpstreamStylePipeline"])
def test_a_pipeline_without_generate_blocks_runs_one_session_per_forward_with_a_notice(
        tmp_path, entry):
    report = run_rollout(make_config(tmp_path, entry, batch=4, prompts=2))

    assert report.status == "ok"
    assert report.warnings[0] == ("rollout.batch: 4, but the pipeline has no generate_blocks "
                                  "(SupportsARDiffusionBatchGeneration): one session per forward")
    batching = report.to_dict()["batching"]
    assert batching["batch"] == 1 and set(batching["forwards"]) == {"1"}
    assert all(video.shape[0] == FRAMES for video in videos(tmp_path, 2))


def test_auto_on_a_pipeline_without_generate_blocks_says_nothing(tmp_path):
    report = run_rollout(make_config(tmp_path, "ProbePipeline", prompts=2))

    assert report.warnings == [] and report.to_dict()["batching"]["batch"] == 1


# -- more than fits: the most that fit, said (#35) -------------------------------------------
def test_a_batch_larger_than_the_resident_sessions_runs_the_most_that_fit(tmp_path):
    report = run_rollout(make_config(tmp_path, batch=3, runtime={"max_sessions": 2}))

    assert report.status == "ok" and report.to_dict()["batching"]["batch"] == 2
    assert report.warnings[0] == ("rollout.batch: 3 for 4 prompts runs 2 per forward, the most "
                                  "that fit: runtime.max_sessions: 2 keeps 2 sessions resident")
    assert all(video.shape[0] == FRAMES for video in videos(tmp_path, 4))


def test_auto_says_what_keeps_it_below_the_prompts(tmp_path):
    report = run_rollout(make_config(tmp_path, prompts=4, args={"session_capacity": 3}))

    assert report.to_dict()["batching"]["batch"] == 3
    assert report.warnings[0].startswith("rollout.batch: auto for 4 prompts runs 3 per forward, "
                                         "the most that fit: the pipeline's session_capacity "
                                         "of 3")


def test_a_batch_larger_than_the_pipeline_takes_runs_what_it_takes(tmp_path):
    report = run_rollout(make_config(tmp_path, args={"max_batch_size": 2}, batch=3))

    assert report.to_dict()["batching"]["batch"] == 2
    assert report.warnings[0] == ("rollout.batch: 3 for 4 prompts runs 2 per forward, the most "
                                  "that fit: the pipeline's max_batch_size is 2")


def test_a_max_batch_size_that_is_not_a_count_is_refused(tmp_path):
    with pytest.raises(PipelineLoadError, match=r"^pipeline: max_batch_size is 0; it must be an "
                       r"integer >= 1"):
        run_rollout(make_config(tmp_path, args={"max_batch_size": 0}))


# -- failures and stops, per stream ------------------------------------------------------------
def test_a_failure_after_a_commit_fails_every_session_of_its_batch(tmp_path):
    """RowBatchProbe commits row by row: stream-1's fault comes after stream-0's commit, so
    the forward cannot run again row by row and every session of it fails."""
    report = run_rollout(make_config(tmp_path, args={"fail_session": "stream-1"}, prompts=3,
                                     batch=3, frames=12))

    assert (report.status, report.exit_code) == ("failed", 1)
    assert report.error.startswith("batch of 3 sessions ('stream-0' block 0, 'stream-1' block 0, "
                                   "'stream-2' block 0): generate_blocks raised RuntimeError")
    assert list(tmp_path.glob("out-*.npy")) == []  # no frame was made: no file
    assert report.sessions["failed"] == 3 and report.kv["pages_in_use"] == 0
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)


def test_a_batch_only_failure_before_any_commit_runs_each_stream_alone(tmp_path):
    """A fault of the batched forward (at its first row, before anything is committed) that
    one session per forward does not hit: each stream's block runs again on its own, and
    every stream makes every frame."""
    report = run_rollout(make_config(tmp_path, args={"fail_at_block": 2}, prompts=3, batch=3,
                                     frames=12))

    assert (report.status, report.exit_code) == ("ok", 0)
    assert [video.shape[0] for video in videos(tmp_path, 3)] == [12, 12, 12]
    assert report.kv["pages_in_use"] == 0


def test_a_stop_ends_every_stream_of_the_batch_at_the_same_block(tmp_path):
    stop = RolloutStop()

    def on_event(event):
        if event.phase == "rollout":  # the first stream's first block: its batch still ends
            stop.request("SIGTERM")

    report = run_rollout(make_config(tmp_path, prompts=3, batch=3, frames=12), on_event, stop)

    assert (report.status, report.error) == ("interrupted", "interrupted by SIGTERM")
    assert [video.shape[0] for video in videos(tmp_path, 3)] == [2, 2, 2]
    assert report.kv["pages_in_use"] == 0


# -- several workers ---------------------------------------------------------------------------
def test_the_ranks_batching_merges_into_the_jobs():
    rank = lambda batch, forwards, streams: {  # noqa: E731
        "batch": batch, "requested": None, "forwards": forwards,
        "streams": [{"stream": s, "blocks": 3, "block_latency_s": {}} for s in streams]}

    merged = merge_batching([rank(2, {"2": 3}, [0, 2, 4]), rank(2, {"1": 3, "2": 3}, [1, 3])])

    assert merged["forwards"] == {"1": 3, "2": 6} and merged["batch"] == 2
    assert [s["stream"] for s in merged["streams"]] == [0, 1, 2, 3, 4]
    assert merge_batching([]) is None


@pytest.mark.heavy
def test_cli_workers_and_batch_compose(tmp_path):
    """`ardiff rollout --workers 2 --batch 2`: each worker batches its own prompts."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"p{i}\n" for i in range(4)))
    config = tmp_path / "run.yaml"
    config.write_text(f"pipeline: {{entry: '{BATCH_FILE}:RowBatchProbe'}}\n"
                      f"runtime: {{device: cpu, memory_budget: 16MiB}}\n"
                      f"rollout: {{frames: {FRAMES}}}\n")

    done = installed("rollout", config, "--prompts", prompts, "-o", tmp_path / "out-{index}.npy",
                     "--json", "-", "--workers", "2", "--batch", "2", "--no-progress")

    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    jsonschema.validate(record, STATS_SCHEMA)
    batching = record["batching"]
    assert batching["batch"] == 2 and batching["forwards"] == {"2": 6}  # 2 per worker, 3 blocks
    assert [s["stream"] for s in batching["streams"]] == [0, 1, 2, 3]
    assert [first_pixels(v) for v in videos(tmp_path, 4)] == [[0, 1, 2, 3, 4]] * 4


@pytest.mark.heavy
def test_cli_tiny_dit_batch_4_writes_8_videos_as_the_unbatched_run(tmp_path):
    """The issue's check: 8 prompts, `--batch 4`, each video equal to `--batch 1`'s within
    one level of uint8 (the batched forward may sum in another order)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a ball number {i}\n" for i in range(8)))
    (tmp_path / "one").mkdir()
    runs = {}
    for batch, folder in (("4", tmp_path), ("1", tmp_path / "one")):
        done = installed("rollout", TINY_DIT, "--prompts", prompts, "--frames", "8",
                         "-o", folder / "out-{index}.npy", "--batch", batch, "--json", "-",
                         "--no-progress")
        assert done.returncode == 0, done.stderr
        runs[batch] = json.loads(done.stdout)["batching"]

    assert runs["4"]["batch"] == 4 and set(runs["4"]["forwards"]) == {"4"}
    assert runs["1"]["forwards"] == {"1": sum(s["blocks"] for s in runs["1"]["streams"])}
    for video, expected in zip(videos(tmp_path, 8), videos(tmp_path / "one", 8)):
        assert video.shape == expected.shape
        assert np.abs(video.astype(int) - expected.astype(int)).max() <= 1


def test_a_budget_short_of_the_asked_rows_plans_the_most_that_fit(tmp_path):
    """Not halved to a power of two (8 -> 4 -> 2): the most rows whose blocks and sessions
    the budget holds (#35)."""
    from ardiff.engine.build import resolve

    resolved = resolve(make_config(tmp_path))
    roomy = resolved.plan(16 << 20, "float32", batch_rows=1)
    per_row = roomy.inflight_pages * roomy.page_bytes  # one row's block in flight
    for rows in (3, 5, 6):
        budget = roomy.fixed_bytes + (rows - 1) * per_row + rows * roomy.bytes_per_session
        config = make_config(tmp_path, runtime={"memory_budget": budget})
        plan = resolve(config).plan(budget, "float32", batch_rows=8)
        assert plan.batch_rows == rows and plan.session_capacity >= rows


def test_a_row_that_fails_before_committing_fails_its_stream_only(tmp_path):
    """The tiny DiT commits every row at the end of its forward: a row that raises while
    the batch denoises fails its own stream (keeping its frames); the others finish."""
    data = {"pipeline": {"entry": f"{SUPPORT / 'row_fault_pipelines.py'}:BoomRowDiT",
                         "args": {"frames_per_block": 3, "window_frames": 9, "sink_frames": 1,
                                  "at_block": 2}},
            "runtime": {"device": "cpu", "memory_budget": "64MiB"},
            "rollout": {"frames": 12, "prompts": ["a", "boom", "b", "c"], "batch": 4},
            "output": {"path": str(tmp_path / "out-{index}.npy"), "fps": 8}}
    report = run_rollout(build_config(data, base_dir=tmp_path))

    assert (report.status, report.exit_code) == ("failed", 1)
    assert "boom" in report.error and "\n" not in report.error
    assert [video.shape[0] for video in videos(tmp_path, 4)] == [12, 6, 12, 12]
    assert report.kv["pages_in_use"] == 0
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)

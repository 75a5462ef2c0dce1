"""Misuse of the state API as a user sees it: a block used after its `with`, and positions past
`max_model_len` at run time, fail the session closed, and `ardiff rollout` keeps the frames
made before (exit 1, the JSON says which block)."""

from __future__ import annotations

import json

import numpy as np
import probe_pipeline as probe
import pytest
import yaml
from runner_support import PIPELINES_FILE, frame_ids, make_runner, pages_in_use, run

import ardiff


def test_a_stale_block_fails_the_session_closed():
    runner = make_runner(probe.StaleBlockPipeline(stale_at_block=1))
    run(runner, "a", 1)
    with pytest.raises(ardiff.KVStateError, match=r"used after its `with` ended"):
        run(runner, "a", 1, first_block=1)
    assert pages_in_use(runner) == 0 and runner.pipeline.hook_calls[-1] == ("close", "a")
    assert runner.stats().sessions["failed"] == 1


def test_positions_past_max_model_len_fail_at_run_time_not_silently():
    runner = make_runner(probe.ProbePipeline(max_model_len=6))
    assert [frame_ids(o) for o in run(runner, "a", 3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ardiff.KVStateError, match=r"at frames 6\.\.7 passes the spec's "
                                                  r"max_model_len=6"):
        run(runner, "a", 1, first_block=3)
    assert pages_in_use(runner) == 0
    # A reset starts the positions over.
    result = runner.execute(ardiff.RolloutRequest("a", block_index=0, reset=True))
    assert frame_ids(result.output) == [0, 1]


def test_rollout_of_a_pipeline_that_keeps_a_block_exits_1_and_keeps_the_frames(tmp_path,
                                                                              ardiff_main):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": {"entry": f"{PIPELINES_FILE}:StaleBlockPipeline",
                     "args": {"stale_at_block": 2}},
        "runtime": {"device": "cpu", "memory_budget": "64MiB"},
        "warmup": {"enabled": False},
        "rollout": {"frames": 10}, "output": {"path": str(tmp_path / "out.npy")}}))
    result = ardiff_main("rollout", config, "--quiet", "--json", tmp_path / "stats.json")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "used after its `with` ended" in lines[0], result.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["status"] == "failed" and stats["frames"]["written"] == 4
    assert np.load(tmp_path / "out.npy").shape[0] == 4  # blocks 0 and 1, 2 frames each

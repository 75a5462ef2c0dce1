"""ardiff/rollout/block_log.py: one record per block, its time split into stages (#35)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from ardiff.config.run import load_config
from ardiff.rollout.block_log import BLOCK_RECORD_SCHEMA, BlockLog
from ardiff.rollout.job import run_rollout

TINY_DIT = Path(__file__).resolve().parents[2] / "configs" / "tiny-dit.yaml"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("log") / "out-{index}.npy"
    config = load_config(TINY_DIT, ["rollout.frames=9", "rollout.prompts=[a, b]",
                                    "rollout.batch=2", f"output.path={out}",
                                    "warmup.enabled=false"])
    log = BlockLog()
    assert run_rollout(config, on_event=log.record).status == "ok"
    return log.records


def test_a_record_per_block_and_stream(records):
    assert [(r["stream"], r["block"]) for r in records] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]  # 3 blocks of 3 frames, 2 per forward
    for record in records:
        jsonschema.validate(record, BLOCK_RECORD_SCHEMA)
        assert record["frames"] == 3 and record["pages_in_use"] > 0


def test_the_stages_add_up_to_the_forward(records):
    for r in records:
        assert r["denoise_s"] > 0 and r["commit_s"] > 0  # the tiny DiT probes, then commits
        parts = r["denoise_s"] + r["commit_s"] + r["other_s"]
        assert parts == pytest.approx(r["latency_s"], rel=1e-6, abs=1e-9)
        assert r["end_s"] == pytest.approx(r["start_s"] + r["latency_s"])
        assert r["encode_wait_s"] is not None and r["encode_wait_s"] >= 0


def test_a_forwards_blocks_share_its_start_and_the_next_starts_after(records):
    assert records[0]["start_s"] == records[1]["start_s"] == 0.0
    assert records[2]["start_s"] >= records[0]["end_s"]


def test_events_without_a_block_are_not_records():
    log = BlockLog()
    log.record(type("Event", (), {"phase": "warmup", "block": None})())
    assert log.records == []

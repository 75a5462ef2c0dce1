"""The rollout job, in-process: plan and loop (ardiff/rollout/streams.py), run_rollout
(ardiff/rollout/job.py).

Plans are pure: streams, outputs, switch blocks, actions, position and capacity
checks. Rollouts run small real pipelines through the Runner: the recording
pipeline (tests/support/rollout_pipelines.py) logs the requests it gets and
paints frame f grey 20 * f; the probe pipelines (probe_pipeline.py) fail on purpose.
Both make blocks of 2 frames.
"""

from __future__ import annotations

import errno
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch

from ardiff.config.run import PromptSwitch, build_config
from ardiff.engine.build import build_runner
from ardiff.errors import ConfigError, OutputPathError, PipelineError
from ardiff.rollout.job import run_rollout
from ardiff.rollout.report import STATS_SCHEMA
from ardiff.rollout.streams import build_request, check_capacity, iter_rollout, plan_rollout
from ardiff.video import encoders

PIPELINES_DIR = Path(__file__).parents[1] / "support"

import rollout_pipelines as recording

PROBE_FILE = PIPELINES_DIR / "probe_pipeline.py"
FRAMES_PER_BLOCK = 2


def make_config(tmp_path: Path, entry: str = "RecordingPipeline", args: dict | None = None,
                warmup: bool = True, **rollout):
    file = PROBE_FILE if entry != "RecordingPipeline" else PIPELINES_DIR / "rollout_pipelines.py"
    data = {"pipeline": {"entry": f"{file}:{entry}", "args": args or {}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "warmup": {"enabled": warmup},
            "rollout": {"frames": 5, "prompt": "p", **rollout},
            "output": {"path": str(tmp_path / "out.npy"), "fps": 8}}
    return build_config(data, base_dir=tmp_path)


def make_plan(tmp_path: Path, spec_fields: dict | None = None, **rollout):
    spec = recording.RecordingPipeline(**(spec_fields or {})).spec
    return plan_rollout(make_config(tmp_path, **rollout), spec, FRAMES_PER_BLOCK)


def greys(frames) -> list[int]:
    return [int(frame[0, 0, 0]) for frame in frames]


# -- the plan ------------------------------------------------------------------------------
def test_plan_has_one_stream_per_prompt_with_its_own_output(tmp_path):
    plan = make_plan(tmp_path, prompts=["a", "b", "c"])

    assert [(s.session_id, s.schedule[0].prompt) for s in plan.streams] == [
        ("stream-0", "a"), ("stream-1", "b"), ("stream-2", "c")]
    assert [s.output_path.name for s in plan.streams] == ["out-0.npy", "out-1.npy", "out-2.npy"]
    assert plan.blocks_per_stream == 3 and not plan.interleave  # 5 frames: 2 + 2 + 1
    assert make_plan(tmp_path).streams[0].output_path == tmp_path / "out.npy"


def test_prompts_file_skips_blanks_and_comments(tmp_path):
    (tmp_path / "prompts.txt").write_text("# header\n a cat \n\na dog\n")

    plan = make_plan(tmp_path, prompts="prompts.txt")  # relative to the config's folder

    assert [s.schedule[0].prompt for s in plan.streams] == ["a cat", "a dog"]


def test_switches_apply_at_the_first_block_at_or_after_their_frame(tmp_path):
    schedule = [{"frame": 0, "prompt": "a"}, {"frame": 3, "prompt": "b", "on_switch": "reset"},
                {"frame": 6, "prompt": "c", "on_switch": "clear-cross"}]
    plan = make_plan(tmp_path, frames=10, prompt=schedule)
    stream = plan.streams[0]

    requests = [build_request(plan, stream, b) for b in range(plan.blocks_per_stream)]

    assert [r.prompt for r in requests] == ["a", "a", "b", "c", "c"]
    assert [r.reset for r in requests] == [False, False, True, False, False]
    assert [r.clear_cross_kv for r in requests] == [False, False, False, True, False]
    assert plan.switch_block(PromptSwitch(4, "x")) == 2 == plan.switch_block(PromptSwitch(3, "x"))


def test_actions_are_per_block_and_repeat(tmp_path):
    plan = make_plan(tmp_path, frames=10, actions=["left", ["up", "down"]])

    actions = [build_request(plan, plan.streams[0], b).actions for b in range(5)]

    assert actions == [("left",), ("up", "down"), ("left",), ("up", "down"), ("left",)]
    assert build_request(make_plan(tmp_path), plan.streams[0], 0).actions is None


def test_positions_past_max_model_len_are_refused_with_the_numbers(tmp_path):
    with pytest.raises(ConfigError) as caught:
        make_plan(tmp_path, spec_fields={"max_model_len": 8}, frames=20)

    assert str(caught.value) == (
        "rollout.frames: 20 frames need 10 blocks in a row, frame positions up to 20, but the "
        "pipeline's max_model_len is 8; lower rollout.frames to 8 or add a prompt switch with "
        "on_switch: reset")


def test_a_reset_switch_lets_a_long_rollout_fit_max_model_len(tmp_path):
    schedule = [{"frame": 0, "prompt": "a"}, {"frame": 8, "prompt": "a", "on_switch": "reset"},
                {"frame": 16, "prompt": "a", "on_switch": "reset"}]

    plan = make_plan(tmp_path, spec_fields={"max_model_len": 8}, frames=20, prompt=schedule)

    assert plan.blocks_per_stream == 10  # runs of 4, 4 and 2 blocks: 8 positions at most


def kv_plan(budget_bytes: int, session_capacity: int = 4):
    import ardiff
    from ardiff.kv.plan import make_plan as make_kv_plan

    spec = ardiff.ARDiffusionKVCacheSpec(
        num_layers=2, num_kv_heads=2, head_size=4, tokens_per_frame=6, frames_per_block=2,
        window_frames=5, sink_frames=1, session_capacity=session_capacity,
        kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))
    return make_kv_plan(spec, "float32", 4, budget_bytes)  # 1,536 shared + 3,072 per session


def test_interleave_must_fit_every_prompt_at_once_and_says_what_binds(tmp_path):
    prompts = ["a", "b", "c"]
    interleaved = make_plan(tmp_path, prompts=prompts, interleave=True)
    with pytest.raises(ConfigError, match=r"^rollout.interleave: 3 prompts need 3 resident "
                                          r"sessions but runtime.memory_budget \(7.5KiB holds 2 "
                                          r"at 3.0KiB each\) keeps 2; raise it, use fewer"):
        check_capacity(interleaved, kv_plan(1536 + 2 * 3072))
    with pytest.raises(ConfigError, match=r"but the pipeline's session_capacity of 2 "
                                          r"\(pipeline.args.session_capacity where the pipeline "
                                          r"takes it\) keeps 2"):
        check_capacity(interleaved, kv_plan(1 << 20, session_capacity=2))
    with pytest.raises(ConfigError, match=r"but runtime.max_sessions: 2 keeps 2"):
        check_capacity(interleaved, kv_plan(1 << 20).__class__(
            **{**kv_plan(1 << 20).__dict__, "session_capacity": 2}), max_sessions=2)

    check_capacity(make_plan(tmp_path, prompts=prompts), kv_plan(1536 + 3072))  # one at a time
    check_capacity(interleaved, kv_plan(1 << 20))


# -- iter_rollout --------------------------------------------------------------------------
def rollout_events(config):
    runner = build_runner(config)
    plan = plan_rollout(config, runner.cache.spec, FRAMES_PER_BLOCK)
    try:
        return list(iter_rollout(runner, plan)), runner.pipeline, runner.stats()
    finally:
        runner.close()


def test_each_stream_gets_exactly_its_frames_then_its_session_closes(tmp_path):
    events, pipeline, stats = rollout_events(make_config(tmp_path, prompts=["a", "b"]))

    assert [(e.stream.index, e.block_index, e.frames_written) for e in events] == [
        (0, 0, 2), (0, 1, 4), (0, 2, 5), (1, 0, 2), (1, 1, 4), (1, 2, 5)]
    assert [len(e.frames) for e in events] == [2, 2, 1] * 2  # the last block is cut
    assert greys(torch.cat([e.frames for e in events[:3]])) == [0, 20, 40, 60, 80]
    assert [r["prompt"] for r in pipeline.records] == ["a"] * 3 + ["b"] * 3
    assert stats.sessions["created"] == 2 == stats.sessions["closed"]
    assert stats.sessions["resident"] == 0


def test_interleaved_streams_run_round_robin(tmp_path):
    events, pipeline, stats = rollout_events(
        make_config(tmp_path, prompts=["a", "b"], interleave=True, frames=4))

    assert [(e.stream.index, e.block_index) for e in events] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [r["session_id"] for r in pipeline.records] == ["stream-0", "stream-1"] * 2
    assert stats.sessions["evicted"] == 0


# -- run_rollout ---------------------------------------------------------------------------
def test_run_rollout_writes_the_video_and_reports_progress(tmp_path):
    events = []

    report = run_rollout(make_config(tmp_path), on_event=events.append)

    assert (report.status, report.exit_code, report.error) == ("ok", 0, None)
    assert greys(np.load(tmp_path / "out.npy")) == [0, 20, 40, 60, 80]
    assert [(e.phase, e.frames_written) for e in events] == [
        ("warmup", 0), ("rollout", 2), ("rollout", 4), ("rollout", 5), ("done", 5)]
    assert {e.frames_total for e in events} == {5}
    assert report.frames_written == 5 and len(report.block_latencies_s) == 3
    assert report.warmup_s is not None and report.time_to_first_frame_s is not None
    assert report.real_time_factor > 0 and report.warnings == []
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)


def test_a_bad_output_path_is_refused_before_anything_runs(tmp_path):
    config = make_config(tmp_path)
    bad = build_config({"pipeline": {"entry": config.pipeline.entry, "args": {}},
                        "output": {"path": str(tmp_path / "nope" / "out.mp4")}})

    with pytest.raises(OutputPathError, match="output.path: .* does not exist"):
        run_rollout(bad)
    assert not (tmp_path / "nope").exists()


def test_a_failure_at_block_k_keeps_the_blocks_before_it(tmp_path):
    config = make_config(tmp_path, "FailingForwardPipeline", {"fail_at_block": 2}, frames=12)

    report = run_rollout(config)

    assert (report.status, report.exit_code) == ("failed", 1)
    assert report.error.startswith("session 'stream-0' block 2: generate_block raised "
                                   "RuntimeError: injected fault at block 2")
    assert isinstance(report.exception, PipelineError)
    assert np.load(tmp_path / "out.npy").shape[0] == 2 * FRAMES_PER_BLOCK
    assert report.frames_written == 4 == report.outputs[0].frames
    assert report.sessions["failed"] == 1 and report.kv["pages_in_use"] == 0
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)


def test_ctrl_c_inside_a_block_is_an_interrupted_run_with_its_frames(tmp_path):
    config = make_config(tmp_path, "FailingForwardPipeline",
                         {"fail_at_block": 1, "fail_stage": "interrupt"}, warmup=False,
                         frames=12)

    report = run_rollout(config)

    assert (report.status, report.exit_code, report.error) == ("interrupted", 130, "interrupted")
    assert np.load(tmp_path / "out.npy").shape[0] == FRAMES_PER_BLOCK
    assert report.kv["pages_in_use"] == 0
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)


def test_ctrl_c_during_warmup_is_an_interrupted_run_without_output(tmp_path):
    config = make_config(tmp_path, "FailingForwardPipeline",  # warmup runs blocks 0, 1, 2
                         {"fail_at_block": 1, "fail_stage": "interrupt"}, frames=12)

    report = run_rollout(config)

    assert (report.status, report.exit_code) == ("interrupted", 130)
    assert report.frames_written == 0 and report.outputs == []
    assert not (tmp_path / "out.npy").exists()
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)


def test_an_encoder_failure_is_a_failed_run_with_the_frames_before_it(tmp_path, monkeypatch):
    original = encoders.NpyEncoder._encode_frame

    def encode_frame(self, frame):
        if self.frames == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, frame)

    monkeypatch.setattr(encoders.NpyEncoder, "_encode_frame", encode_frame)

    report = run_rollout(make_config(tmp_path, frames=8))

    assert (report.status, report.exit_code) == ("failed", 1)
    assert "No space left on device" in report.error
    assert greys(np.load(tmp_path / "out.npy")) == [0, 20, 40]
    assert report.outputs[0].frames == 3
    jsonschema.validate(report.to_dict(), STATS_SCHEMA)


def test_a_failing_close_hook_still_delivers_the_last_block(tmp_path):
    config = make_config(tmp_path, "FailingHooksPipeline", {"fail_hooks": ["close"]},
                         warmup=False, frames=5)

    report = run_rollout(config)

    assert report.status == "failed" and "injected close hook fault" in report.error
    assert np.load(tmp_path / "out.npy").shape[0] == 5  # every frame made is in the file

"""A prompt schedule in latent frames (`latent_frame:`), and the warning for a switch that does
not apply where it was asked (ardiff/rollout/switches.py), for causal-Wan's decoder: 1 video
frame for a session's first latent frame, 4 for each later one; 3 latent frames a block."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rollout_pipelines import RecordingPipeline

from ardiff.config.run import PromptSwitch, build_config
from ardiff.errors import ConfigError
from ardiff.rollout.streams import build_request, latent_frame_map, plan_rollout
from ardiff.rollout.switches import latent_frame, resolve_schedule, video_frame

WAN = (1, 4)                 # causal-Wan's latent map
FIRST, PER, LATENT = 9, 12, 3
FAULT_PIPELINES = Path(__file__).resolve().parents[1] / "support" / "fault_pipelines.py"


def plan(tmp_path, prompt, frames=81, latent_map=WAN):
    spec = dataclasses.replace(RecordingPipeline().spec, frames_per_block=LATENT,
                               window_frames=6)
    config = build_config({"pipeline": {"entry": "x:y"},
                           "rollout": {"frames": frames, "prompt": prompt},
                           "output": {"path": str(tmp_path / "out.npy")}}, base_dir=tmp_path)
    return plan_rollout(config, spec, PER, FIRST, latent_map=latent_map)


def test_latent_frames_map_to_video_frames_as_the_wan_vae_decodes_them():
    assert [video_frame(L, WAN) for L in (0, 1, 2, 3, 9, 15, 40)] == [0, 1, 5, 9, 33, 57, 157]
    assert [latent_frame(v, WAN) for v in (0, 1, 5, 9, 33, 57)] == [0, 1, 2, 3, 9, 15]
    wan = SimpleNamespace(video_frames_per_latent_frame=4, video_frames_first_latent_frame=1)
    assert latent_frame_map(wan) == WAN
    assert latent_frame_map(SimpleNamespace()) is None


def test_longlive_s_switches_at_latent_frames_9_and_15_land_on_their_blocks(tmp_path):
    schedule = [{"latent_frame": 0, "prompt": "a"},
                {"latent_frame": 9, "prompt": "b", "on_switch": "recache"},
                {"latent_frame": 15, "prompt": "c", "on_switch": "recache"}]
    p = plan(tmp_path, schedule)
    assert [s.frame for s in p.streams[0].schedule] == [0, 33, 57]
    requests = [build_request(p, p.streams[0], b) for b in range(p.blocks_per_stream)]
    assert [r.prompt for r in requests] == ["a"] * 3 + ["b"] * 2 + ["c"] * 2
    assert [b for b, r in enumerate(requests) if r.extra.get("recache")] == [3, 5]
    assert p.warnings == ()


def test_a_switch_inside_a_block_is_moved_with_a_warning_naming_both_frames(tmp_path):
    schedule = [{"frame": 0, "prompt": "a"}, {"latent_frame": 10, "prompt": "b"},
                {"frame": 50, "prompt": "c"}]
    p = plan(tmp_path, schedule, frames=200)
    assert p.warnings == (
        "rollout.prompt[1]: the switch at latent_frame 10 (video frame 37) applies from latent "
        "frame 12 (video frame 45), the next block boundary (a switch applies where a block "
        "starts)",
        "rollout.prompt[2]: the switch at frame 50 applies from frame 57, the next block "
        "boundary (a switch applies where a block starts)")


def test_a_switch_that_never_applies_says_why(tmp_path):
    replaced = [{"frame": 0, "prompt": "a"}, {"frame": 10, "prompt": "b"},
                {"latent_frame": 5, "prompt": "c"}]  # video frame 17: both apply at 21
    assert plan(tmp_path, replaced).warnings == (
        "rollout.prompt[1]: the switch at frame 10 never applies: rollout.prompt[2] replaces "
        "it in the same block, from frame 21",
        "rollout.prompt[2]: the switch at latent_frame 5 (video frame 17) applies from latent "
        "frame 6 (video frame 21), the next block boundary (a switch applies where a block "
        "starts)")
    late = [{"frame": 0, "prompt": "a"}, {"latent_frame": 20, "prompt": "b"}]  # frame 77
    assert plan(tmp_path, late).warnings == (
        "rollout.prompt[1]: the switch at latent_frame 20 (video frame 77) never applies: the "
        "last block starts at latent frame 18 (video frame 69)",)


def test_frames_on_block_boundaries_give_no_warning(tmp_path):
    schedule = [{"frame": 0, "prompt": "a"}, {"frame": 9, "prompt": "b"},
                {"latent_frame": 6, "prompt": "c", "on_switch": "reset"},
                {"frame": 30, "prompt": "d"}]  # the reset's short block: 21 + 9
    assert plan(tmp_path, schedule).warnings == ()


@pytest.mark.parametrize("schedule, latent_map, message", [
    ([PromptSwitch(0, "a"), PromptSwitch(None, "b", latent_frame=3)], None,
     r"^rollout\.prompt\[1\]\.latent_frame: this pipeline declares no latent frames "
     r"\(video_frames_per_latent_frame\); give frame: \(a video frame\) instead$"),
    ([PromptSwitch(0, "a"), PromptSwitch(9, "b", "reset"), PromptSwitch(None, "c",
                                                                         latent_frame=6)],
     WAN, r"^rollout\.prompt\[2\]\.latent_frame: 6 comes after an on_switch: reset, where the "
          r"latent frames start over; give frame: \(a video frame\) instead$"),
    ([PromptSwitch(0, "a"), PromptSwitch(40, "b"), PromptSwitch(None, "c", latent_frame=9)],
     WAN, r"^rollout\.prompt: the schedule's video frames \[0, 40, 33\] \(latent_frame entries "
          r"converted\) must increase strictly; reorder the entries$"),
])
def test_a_latent_schedule_that_cannot_be_placed_is_a_one_line_error(schedule, latent_map,
                                                                     message):
    with pytest.raises(ConfigError, match=message):
        resolve_schedule(schedule, latent_map)


@pytest.mark.parametrize("entry, message", [
    ({"frame": 9, "latent_frame": 3, "prompt": "b"},
     r"^rollout\.prompt\[1\]: frame 9 and latent_frame 3 both given; give one of them$"),
    ({"prompt": "b"}, r"^rollout\.prompt\[1\]: a schedule entry needs frame \(a video frame\) "
                      r"or latent_frame; add one$"),
    ({"latent_frame": 0, "prompt": "b"},
     r"^rollout\.prompt: schedule latent_frames \[0, 0\] must increase strictly$"),
])
def test_a_schedule_entry_gives_frame_or_latent_frame(tmp_path, entry, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"pipeline": {"entry": "x:y"}, "rollout": {"prompt": [
            {"latent_frame": 0, "prompt": "a"}, entry]}}, base_dir=tmp_path)


def test_the_json_schema_requires_neither_key():
    from ardiff.config.run import config_json_schema

    entry = config_json_schema()["$defs"]["PromptSwitch"]
    assert {"frame", "latent_frame"} <= set(entry["properties"])
    assert entry["required"] == ["prompt"]


def test_a_moved_switch_is_a_warning_in_the_stats_and_on_the_terminal(tmp_path, ardiff_main,
                                                                      write_config):
    config = write_config(f"""
        pipeline: {{entry: '{FAULT_PIPELINES}:FaultPipeline'}}
        runtime: {{device: cpu, memory_budget: 16MiB}}
        rollout:
          frames: 6
          prompt:
            - {{frame: 0, prompt: a}}
            - {{latent_frame: 3, prompt: b}}
        output: {{path: {tmp_path / 'out.npy'}}}
    """)
    result = ardiff_main("rollout", config, "--json", tmp_path / "stats.json", "--quiet")
    assert result.exit_code == 0, result.output
    warning = ("rollout.prompt[1]: the switch at latent_frame 3 (video frame 3) applies from "
               "latent frame 4 (video frame 4), the next block boundary (a switch applies where "
               "a block starts)")
    assert json.loads((tmp_path / "stats.json").read_text())["warnings"] == [warning]
    assert f"warning: {warning}" in result.stderr

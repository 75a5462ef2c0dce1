"""ardiff/rollout/streams.py for decoders whose first latent frame makes fewer video frames
(a causal video VAE: 1, then 4 per latent frame; 3-latent blocks make 9, then 12 frames):
block counts, switch blocks, resets and the max_model_len refusal are exact."""

from __future__ import annotations

import dataclasses
import re

import pytest
from rollout_pipelines import RecordingPipeline

from ardiff.config.run import PromptSwitch, build_config
from ardiff.errors import ConfigError
from ardiff.rollout.streams import build_request, plan_rollout, walk_blocks

FIRST, PER, LATENT = 9, 12, 3


def plan(tmp_path, frames=48, prompt="p", max_model_len=1 << 20):
    spec = dataclasses.replace(RecordingPipeline().spec, frames_per_block=LATENT,
                               window_frames=6, max_model_len=max_model_len)
    config = build_config({"pipeline": {"entry": "x:y"},
                           "rollout": {"frames": frames, "prompt": prompt},
                           "output": {"path": str(tmp_path / "out.npy")}}, base_dir=tmp_path)
    return plan_rollout(config, spec, PER, FIRST)


def test_block_starts_follow_the_short_first_block():
    slots = walk_blocks((PromptSwitch(0, "p"),), 48, FIRST, PER)
    assert [(s.start_frame, s.num_frames) for s in slots] == [(0, 9), (9, 12), (21, 12),
                                                              (33, 12), (45, 12)]
    assert [s.session_block for s in slots] == [0, 1, 2, 3, 4]
    assert len(walk_blocks((PromptSwitch(0, "p"),), 45, FIRST, PER)) == 4  # 9 + 3 * 12


def test_without_a_short_first_block_nothing_changes():
    slots = walk_blocks((PromptSwitch(0, "p"),), 5, 2, 2)
    assert [s.start_frame for s in slots] == [0, 2, 4]


@pytest.mark.parametrize("frame, block", [(1, 1), (9, 1), (10, 2), (21, 2), (22, 3)])
def test_a_switch_applies_to_the_first_block_starting_at_or_after_it(tmp_path, frame, block):
    schedule = [{"frame": 0, "prompt": "a"}, {"frame": frame, "prompt": "b"}]
    p = plan(tmp_path, prompt=schedule)
    assert p.switch_block(PromptSwitch(frame, "b")) == block
    prompts = [build_request(p, p.streams[0], b).prompt for b in range(p.blocks_per_stream)]
    assert prompts == ["a"] * block + ["b"] * (p.blocks_per_stream - block)


def test_a_reset_starts_a_short_block_again():
    schedule = (PromptSwitch(0, "a"), PromptSwitch(21, "b", "reset"))
    slots = walk_blocks(schedule, 48, FIRST, PER)
    assert [(s.start_frame, s.num_frames, s.switching) for s in slots] == [
        (0, 9, None), (9, 12, None), (21, 9, "reset"), (30, 12, None), (42, 12, None)]
    assert [s.session_block for s in slots] == [0, 1, 0, 1, 2]


def test_max_model_len_is_checked_with_the_exact_block_count(tmp_path):
    # 4 blocks of 3 latent frames fit in 12 positions: 9 + 3 * 12 = 45 video frames.
    assert plan(tmp_path, frames=45, max_model_len=12).blocks_per_stream == 4
    message = ("rollout.frames: 48 frames need 5 blocks in a row, frame positions up to 15, but "
               "the pipeline's max_model_len is 12; lower rollout.frames to 45")
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan(tmp_path, frames=48, max_model_len=12)


def test_a_reset_before_the_limit_lets_a_longer_rollout_fit(tmp_path):
    schedule = [{"frame": 0, "prompt": "a"}, {"frame": 33, "prompt": "b", "on_switch": "reset"}]
    p = plan(tmp_path, frames=60, prompt=schedule, max_model_len=12)
    assert [s.session_block for s in p.streams[0].blocks] == [0, 1, 2, 0, 1, 2]


def test_the_pipelines_frame_attributes_are_checked():
    from types import SimpleNamespace

    from ardiff.errors import PipelineLoadError
    from ardiff.rollout.streams import video_frames_per_block

    assert video_frames_per_block(SimpleNamespace(), 3) == (3, 3)
    wan_vae = SimpleNamespace(video_frames_per_latent_frame=4, video_frames_first_latent_frame=1)
    assert video_frames_per_block(wan_vae, 3) == (12, 9)
    with pytest.raises(PipelineLoadError, match=r"^pipeline: video_frames_first_latent_frame is "
                                                r"0; it must be an integer >= 1 \(video frames "
                                                r"the decoder makes for a session's first latent "
                                                r"frame\), or leave it undefined for 4$"):
        video_frames_per_block(SimpleNamespace(video_frames_per_latent_frame=4,
                                                video_frames_first_latent_frame=0), 3)


def test_a_block_longer_than_max_model_len_names_the_pipeline_not_the_frames(tmp_path):
    spec = dataclasses.replace(RecordingPipeline().spec, frames_per_block=4, window_frames=6,
                               max_model_len=3)
    config = build_config({"pipeline": {"entry": "x:y"}, "rollout": {"frames": 2},
                           "output": {"path": str(tmp_path / "out.npy")}}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^pipeline: one block is 4 frames, more than the "
                                          r"pipeline's max_model_len of 3 positions; no rollout "
                                          r"fits: lower frames_per_block"):
        plan_rollout(config, spec, 4)

"""ardiff.open: the config built as the CLI builds it, frames in memory, typed one-line errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ardiff

QUIET = {"warmup": {"enabled": False}}


@pytest.fixture(scope="module")
def run():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ardiff.ArdiffWarning)
        with ardiff.open(None, **QUIET) as opened:
            yield opened


def test_blocks_make_the_frames_asked_for_in_memory(run) -> None:
    blocks = list(run.blocks(frames=5, actions=["left"]))
    assert sum(block.num_frames for block in blocks) == 5
    assert [block.start_frame for block in blocks] == [0, 1, 2, 3, 4]
    assert all(block.frames.dtype == np.uint8 and block.frames.shape[-1] == 3
               for block in blocks)
    assert run.runner.sessions.session_ids == []  # the iterator's session is closed


def test_blocks_are_the_rollout_the_config_describes(run) -> None:
    """Same seed, same actions: the same frames (one process, one batch size)."""
    first = np.concatenate([b.frames for b in run.blocks(frames=3, actions=["up"])])
    again = np.concatenate([b.frames for b in run.blocks(frames=3, actions=["up"])])
    assert np.array_equal(first, again)


def test_a_bad_value_is_the_config_keys_error(run) -> None:
    with pytest.raises(ardiff.ConfigError, match=r"^rollout.frames: 0 is invalid; it must be > 0$"):
        run.blocks(frames=0)
    with pytest.raises(ardiff.ConfigError, match=r"rollout.actions\[0\]: 'jump' is not an action"):
        run.blocks(actions=["jump"])


def test_a_prompt_the_model_ignores_is_a_warning(run) -> None:
    with pytest.warns(ardiff.ArdiffWarning, match="prompt: given, but this pipeline ignores "
                                                  "prompts"):
        run.blocks(frames=1, prompt="a red ball")
    assert any("ignores prompts" in warning for warning in run.warnings)


def test_sections_and_overrides_build_the_config() -> None:
    with ardiff.open(None, rollout={"seed": 9}, overrides=["rollout.frames=2"], **QUIET) as run:
        assert run.config.rollout.seed == 9 and run.config.rollout.frames == 2
        assert sum(b.num_frames for b in run.blocks()) == 2
    run.close()  # twice: nothing happens


def test_an_unknown_key_is_refused_before_loading() -> None:
    with pytest.raises(ardiff.ConfigError, match=r"^rollout.sead: unknown key"):
        ardiff.open(None, rollout={"sead": 1})
    with pytest.raises(ardiff.ConfigError, match=r"^open: rollout=3 is not a mapping of keys; "):
        ardiff.open(None, rollout=3)


def test_a_run_config_takes_no_sections() -> None:
    config = ardiff.load_config(None)
    with pytest.raises(ardiff.ConfigError, match=r"^open: keyword sections and overrides need "
                                                 r"a config path \(or None\), not a RunConfig"):
        ardiff.open(config, rollout={"seed": 1})


def test_stats_count_the_blocks(run) -> None:
    before = len(run.stats().block_latencies_s)
    list(run.blocks(frames=2))
    assert len(run.stats().block_latencies_s) == before + 2

"""Run.session: a session stepped from Python; misuse is a typed one-line error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ardiff

QUIET = {"warmup": {"enabled": False}}


@pytest.fixture(scope="module")
def run():
    """The default model with room for one session (so a second one evicts the first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ardiff.ArdiffWarning)
        with ardiff.open(None, runtime={"max_sessions": 1}, **QUIET) as opened:
            yield opened


def test_steps_match_the_rollout_of_the_same_actions(run) -> None:
    with run.session() as session:
        stepped = [session.step(action=a).frames for a in ["left", "up", "up"]]
    rolled = [b.frames for b in run.blocks(frames=3, actions=["left", "up", "up"])]
    for a, b in zip(stepped, rolled):
        assert np.array_equal(a, b)


def test_reset_starts_the_session_over(run) -> None:
    with run.session() as session:
        first = session.step(action="left")
        session.step(action="left")
        session.reset()
        again = session.step(action="left")
    assert (again.index, again.start_frame) == (0, 0)
    assert np.array_equal(first.frames, again.frames)


def test_a_closed_session_refuses_steps(run) -> None:
    session = run.session(session_id="mine")
    session.step()
    session.close()
    session.close()
    with pytest.raises(ardiff.SessionError, match=r"^session 'mine' is closed; open another "
                                                  r"with run.session\(\)$"):
        session.step()


def test_an_evicted_session_says_so_until_reset(run) -> None:
    first, second = run.session(), run.session()
    first.step()
    second.step()  # one slot: the first session is evicted
    with pytest.raises(ardiff.SessionError, match=r"is no longer in the cache .*call reset\(\) "
                                                  r"to start it again, or open at most 1 "
                                                  r"sessions at once$"):
        first.step()
    first.reset()
    assert first.step().index == 0
    first.close()
    second.close()


def test_bad_steps_are_refused_before_any_work(run) -> None:
    with run.session() as session:
        with pytest.raises(ardiff.ConfigError, match=r"^action\[0\]: 'jump' is not an action"):
            session.step(action="jump")
        with pytest.raises(ardiff.ConfigError, match=r"^on_switch: 'later' is not a switch; use "
                                                     r"one of keep, clear-cross, reset, recache$"):
            session.step(prompt="x", on_switch="later")
        with pytest.raises(ardiff.ConfigError, match=r"^prompt: 'a\\x00b' "):
            session.step(prompt="a\x00b")
        assert session.block_index == 0  # nothing ran


def test_a_block_past_max_model_len_is_refused(run) -> None:
    with run.session() as session:
        session.block_index = run.spec.max_model_len  # as if it had run that long
        session.frames_made = 1
        with pytest.raises(ardiff.ConfigError, match=r"past the pipeline's max_model_len of "
                                                     r"\d+; call reset\(\) or step with "
                                                     r"on_switch='reset'$"):
            session.step()


def test_a_prompt_to_a_model_that_ignores_prompts_warns(run) -> None:
    with run.session() as session:
        with pytest.warns(ardiff.ArdiffWarning, match="this pipeline ignores prompts"):
            session.step(prompt="a red ball")

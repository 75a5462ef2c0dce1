"""SessionMap: least-recently-used order, capacity and lifecycle counters (integers only)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ardiff.engine.sessions import Release, SessionMap

WARMUP = "__warmup__"


def test_touch_creates_then_moves_to_most_recent():
    sessions = SessionMap(capacity=3)
    for sid in ("a", "b", "c"):
        sessions.touch(sid)
    assert sessions.session_ids == ["a", "b", "c"]
    assert sessions.least_recently_used() == "a"

    info = sessions.touch("a")

    assert info.session_id == "a"
    assert sessions.session_ids == ["b", "c", "a"]
    assert sessions.least_recently_used() == "b"
    assert sessions.counts.created == 3  # touching a resident session creates nothing


def test_touch_returns_the_same_info_while_resident():
    sessions = SessionMap(capacity=2)
    first = sessions.touch("a")
    first.blocks, first.frame_size = 3, (64, 64)
    again = sessions.touch("a")
    assert again is first and (again.blocks, again.frame_size) == (3, (64, 64))


def test_is_full_at_capacity_and_touching_a_new_session_then_is_a_bug():
    sessions = SessionMap(capacity=2)
    sessions.touch("a")
    assert not sessions.is_full
    sessions.touch("b")
    assert sessions.is_full and len(sessions) == 2
    sessions.touch("a")  # resident: fine at capacity
    with pytest.raises(AssertionError, match="make room"):
        sessions.touch("c")


@pytest.mark.parametrize("why", list(Release))
def test_remove_counts_the_reason_and_updates_resident(why):
    sessions = SessionMap(capacity=2)
    sessions.touch("a")
    sessions.touch("b")
    sessions.remove("a", why)
    counts = sessions.counts.as_dict()
    assert counts[why.value] == 1
    assert sum(counts[r.value] for r in Release) == 1
    assert counts["resident"] == 1 and "a" not in sessions and "b" in sessions


def test_a_removed_session_comes_back_as_a_new_one():
    sessions = SessionMap(capacity=1)
    sessions.touch("a").blocks = 5
    sessions.remove("a", Release.RESET)
    assert sessions.touch("a").blocks == 0
    assert sessions.counts.as_dict() == dict(created=2, reset=1, closed=0, evicted=0, failed=0,
                                             resident=1)


def test_uncounted_sessions_take_a_slot_but_never_count():
    sessions = SessionMap(capacity=2, uncounted=frozenset({WARMUP}))
    sessions.touch(WARMUP)
    sessions.touch("a")
    assert sessions.is_full and sessions.counts.created == 1
    sessions.remove(WARMUP, Release.FAILED)
    sessions.remove("a", Release.CLOSED)
    assert sessions.counts.as_dict() == dict(created=1, reset=0, closed=1, evicted=0, failed=0,
                                             resident=0)


# -- property: the map behaves like an LRU model ---------------------------------------------
ops = st.lists(st.tuples(st.sampled_from(["touch", "remove"]), st.sampled_from("abcde"),
                         st.sampled_from(list(Release))), max_size=60)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 4), ops=ops)
def test_matches_an_lru_model(capacity, ops):
    sessions, model = SessionMap(capacity), OrderedDict()
    created = removed = 0
    for op, sid, why in ops:
        if op == "touch":
            if sid not in model and len(model) >= capacity:  # the runner evicts first
                oldest = sessions.least_recently_used()
                assert oldest == next(iter(model))
                sessions.remove(oldest, Release.EVICTED)
                model.pop(oldest)
                removed += 1
            created += sid not in model
            sessions.touch(sid)
            model[sid] = None
            model.move_to_end(sid)
        elif sid in model:
            sessions.remove(sid, why)
            model.pop(sid)
            removed += 1
        assert sessions.session_ids == list(model)
        assert len(sessions) <= capacity
    counts = sessions.counts
    assert counts.created == created and counts.resident == len(model)
    assert counts.reset + counts.closed + counts.evicted + counts.failed == removed
    assert created - removed == len(model)

"""The front's routing table on its own (no processes, no HTTP): routes by worker and
generation, a dead worker's ids remembered as lost (the newest only), a clean stop's not,
routes of sessions a worker no longer holds forgotten."""

from __future__ import annotations

import time

from ardiff.serve.routing import RouteTable


def test_a_dead_worker_s_sessions_are_lost_with_its_error_and_a_clean_stop_s_are_not():
    table = RouteTable()
    table.add("a", 0, 0)
    table.add("b", 1, 0)
    table.add("c", 1, 0)
    assert table.counts(2) == [1, 2] and table.get("b").worker == 1
    assert sorted(table.fail_worker(1, "worker 1 died")) == ["b", "c"]
    assert table.get("b") is None and table.lost_error("b") == (1, "worker 1 died")
    assert table.counts(2) == [1, 0]
    assert table.fail_worker(0, None) == ["a"] and table.lost_error("a") is None
    table.forget("b")
    assert table.lost_sessions() == [("c", 1, "worker 1 died")]


def test_lost_records_keep_the_newest_and_a_new_route_clears_one():
    table = RouteTable(max_lost=2)
    for sid in "xyz":
        table.remember_lost(sid, 0, f"{sid} lost")
    assert [sid for sid, _, _ in table.lost_sessions()] == ["y", "z"]
    table.add("z", 1, 3)  # the client made it again (PUT): live, not lost
    assert table.lost_error("z") is None and table.get("z").generation == 3


def test_routes_a_worker_no_longer_holds_are_dropped_only_if_older_than_the_question():
    table = RouteTable()
    table.add("old", 0, 2)
    table.add("other-generation", 0, 1)
    asked = time.monotonic()
    table.add("new", 0, 2)  # placed after the worker was asked
    table.drop_missing(0, 2, asked, held=set())
    assert table.get("old") is None
    assert table.get("new") is not None and table.get("other-generation") is not None

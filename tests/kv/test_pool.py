"""PagePool: the one owner of page ids (integers only)."""

from __future__ import annotations

import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ardiff.errors import KVStateError
from ardiff.kv.pool import PagePool


def test_allocate_hands_out_distinct_ids_and_counts():
    pool = PagePool(5)
    assert (pool.num_free, pool.num_used) == (5, 0)
    first, second = pool.allocate(2), pool.allocate(3)
    assert sorted(first + second) == [0, 1, 2, 3, 4]
    assert (pool.num_free, pool.num_used, pool.peak_used) == (0, 5, 5)
    pool.free(first)
    assert (pool.num_free, pool.num_used, pool.peak_used) == (2, 3, 5)


def test_allocation_is_all_or_nothing():
    pool = PagePool(4)
    held = pool.allocate(3)
    assert not pool.can_allocate(2)
    assert pool.allocate(2) is None
    assert (pool.num_free, pool.num_used) == (1, 3)  # nothing was taken
    assert pool.allocate(1) is not None
    pool.free(held)
    assert pool.allocate(0) == []
    assert not pool.can_allocate(-1)
    assert pool.allocate(-1) is None


def test_double_free_raises_and_changes_nothing():
    pool = PagePool(3)
    ids = pool.allocate(2)
    pool.free([ids[0]])
    with pytest.raises(KVStateError, match=rf"page pool: page {ids[0]} is already free "
                                           rf"\(double free\)"):
        pool.free(ids)  # ids[1] is still used: it must stay used
    assert pool.num_used == 1
    pool.free([ids[1]])
    assert pool.num_used == 0


def test_repeated_id_in_one_free_raises():
    pool = PagePool(3)
    ids = pool.allocate(2)
    with pytest.raises(KVStateError, match=r"ids \[0, 0\] repeat; a page is freed once"):
        pool.free([ids[0], ids[0]])
    assert pool.num_used == 2


@pytest.mark.parametrize("foreign", [3, -1, 1.0, "0", None])
def test_foreign_id_raises_and_changes_nothing(foreign):
    pool = PagePool(3)
    ids = pool.allocate(3)
    said = re.escape(f"page pool: id {foreign!r} is not a page of this pool (0..2)")
    with pytest.raises(KVStateError, match=said):
        pool.free([ids[0], foreign])
    assert pool.num_used == 3  # ids[0] was not freed either


def test_empty_pool():
    pool = PagePool(0)
    assert pool.allocate(0) == []
    assert pool.allocate(1) is None
    with pytest.raises(KVStateError, match=r"not a page of this pool"):
        pool.free([0])


def test_ids_come_out_lowest_first_and_freed_ids_are_reused_last_freed_first():
    pool = PagePool(6)
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([1, 0])
    assert pool.allocate(3) == [0, 1, 3]  # 0 was freed last, then 1, then a fresh id
    pool.free([3])
    assert pool.allocate(3) == [3, 4, 5]
    assert pool.allocate(1) is None
    assert [pool.is_used(page) for page in range(6)] == [True] * 6


@settings(max_examples=60, deadline=None)
@given(num_pages=st.integers(0, 10),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 99)), max_size=40))
def test_ids_are_those_a_free_list_hands_out(num_pages, ops):
    """The pool hands out exactly what a Python list used as a stack did (low ids first,
    freed ids on top), so runs and their NaN-poisoned pages are unchanged."""
    pool, stack, held = PagePool(num_pages), list(range(num_pages - 1, -1, -1)), []
    for is_allocate, num, pick in ops:
        if is_allocate:
            expected = [stack.pop() for _ in range(num)] if num <= len(stack) else None
            assert pool.allocate(num) == expected
            held += expected or []
        elif held:
            page_ids = [held.pop(pick % len(held)) for _ in range(min(num, len(held)))]
            pool.free(page_ids)
            stack += page_ids
        assert pool.num_free == len(stack) and pool.peak_used >= pool.num_used


def test_a_pool_of_a_trillion_pages_costs_nothing_until_pages_are_used():
    """Building the pool made a list of every id (10**7 pages: 390 MiB, 0.2 s); now the
    bookkeeping grows with the pages handed out, never with the pool."""
    tracemalloc.start()
    try:
        pool = PagePool(10**12)
        ids = pool.allocate(1000)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ids == list(range(1000)) and pool.num_free == 10**12 - 1000
    assert peak < 100_000
    pool.free(ids)
    assert pool.num_used == 0 and pool.peak_used == 1000
    with pytest.raises(KVStateError, match=r"page pool: page 5000 is already free"):
        pool.free([5000])  # never handed out

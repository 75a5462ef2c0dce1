"""PagePool: the one owner of page ids (integers only)."""

from __future__ import annotations

import re

import pytest

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

"""Rows of a batched forward (ardiff/pipelines/shared/rows.py): a session as a batch of one,
sub-batches, and rows computed in groups put back in order."""

from __future__ import annotations

import pytest
import torch

from ardiff.errors import PipelineError
from ardiff.kv.backend import create_cache
from ardiff.kv.batch import KVStateBatch
from ardiff.kv.state import open_state
from ardiff.pipelines.shared.rows import OneRow, as_rows, group_rows, put, subset, take
from tests.support.kvdrive import make_spec, plan_for


def test_groups_keep_first_seen_order_and_put_restores_row_order():
    keys = [4, None, 4, 2, None]
    groups = group_rows(keys)
    assert groups == {4: [0, 2], None: [1, 4], 2: [3]}
    x = torch.arange(5.0)[:, None]                       # row i holds i
    parts = {key: (rows, take(x, rows, 5) * 10) for key, rows in groups.items()}
    assert torch.equal(put(parts, 5), x * 10)
    assert put({"all": ([0, 1, 2, 3, 4], x)}, 5) is x    # one group of every row: no copy


def test_one_row_attends_exactly_as_the_session_block():
    spec = make_spec(num_layers=1, registers=2, session_capacity=3)
    cache = create_cache(plan_for(spec, max_sessions=3), "paged", "cpu", poison=True)
    extra = torch.randn(2, 2, 8)
    direct, as_one = open_state(cache, "a"), OneRow(open_state(cache, "b"))
    for step in range(3):  # empty history, then 1 and 2 blocks of it
        q, k, v = (torch.randn(8, 2, 8) for _ in range(3))   # 2 frames of 4 tokens
        with direct.block("main", commit=True) as blk:
            want = blk.attend(0, q, k, v, extra, extra)
        with as_one.block("main", commit=True) as row:
            assert row.start_frames == [2 * step]
            got = row.attend(0, q[None], k[None], v[None], extra[None], extra[None])
        assert got.shape == (1, 8, 2, 8) and torch.equal(got[0], want)


def test_subsets_and_a_batch_of_one():
    spec = make_spec(num_layers=1, session_capacity=3)
    cache = create_cache(plan_for(spec, max_sessions=3), "dense", "cpu")
    states = KVStateBatch([open_state(cache, sid) for sid in "abc"])
    assert as_rows(states, 3) is states
    assert isinstance(as_rows(KVStateBatch([states[1]]), 1), OneRow)
    assert isinstance(subset(states, [2]), OneRow) and subset(states, [2])[0] is states[2]
    assert [s.session_id for s in subset(states, [2, 0])] == ["c", "a"]
    with pytest.raises(PipelineError, match=r"^generate_blocks: 2 requests but 3 KV states; "
                                            r"pass one state per request, in the requests' "
                                            r"order$"):
        as_rows(states, 2)

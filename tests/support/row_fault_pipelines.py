"""The tiny DiT with one row that fails: a request whose prompt is "boom" raises at block
`at_block` and later, before any KV is touched (so nothing of its forward is committed).
For tests of a batched forward whose failing row must fail its own session only
(tests/serve/test_faults.py, tests/engine/test_rows.py). Loaded by path in other processes
too: the public `ardiff` API only."""

from __future__ import annotations

from ardiff.pipelines.tiny_dit.pipeline import TinyCausalDiT

BOOM = "boom"


class RowFault(RuntimeError):
    """What a "boom" row raises."""


class BoomRowDiT(TinyCausalDiT):
    def __init__(self, at_block: int = 1, **config) -> None:
        super().__init__(**config)
        self.at_block = at_block

    def generate_blocks(self, requests, states):
        for request in requests:
            if request.prompt == BOOM and request.block_index >= self.at_block:
                raise RowFault(f"{request.session_id} block {request.block_index}: boom")
        return super().generate_blocks(requests, states)

"""Probe pipelines with a batched forward (`generate_blocks`), for the runner's and the
rollout's batch tests.

`RowBatchProbe` runs each row as the one-session forward through `states[i]` (no batched
attend): its frames and what each block saw equal `ProbePipeline`'s by construction, so a
test of the runner's batching does not depend on `ardiff.kv.batch`. `AttendBatchProbe`
runs every probe and the commit as one `states.block(...)` with one batched attend per
layer, each row checked like the probe checks its block (the mean of exactly its frames).
Both record the session ids of every batched forward in `batch_calls` and can fail on
purpose: `fail_session` / `fail_at_block` raise after the rows before it committed,
`leave_open_session` enters a probe block at the end and never exits it, `drop_output` returns one
output too few. Loaded by path (`/abs/path/batch_pipelines.py:RowBatchProbe`) or imported.
"""

from __future__ import annotations

import torch
from probe_pipeline import BRANCH, BlockRecord, ProbePipeline

import ardiff


class _BatchProbe(ProbePipeline):
    def __init__(self, fail_session: str | None = None, fail_at_block: int | None = None,
                 leave_open_session: str | None = None, drop_output: bool = False,
                 max_batch_size: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_session, self.fail_at_block = fail_session, fail_at_block
        self.leave_open_session, self.drop_output = leave_open_session, drop_output
        if max_batch_size is not None:
            self.max_batch_size = max_batch_size
        self.batch_calls: list[list[str]] = []

    def _batch_fault(self, request: ardiff.RolloutRequest, state) -> None:
        if request.session_id == self.fail_session or request.block_index == self.fail_at_block:
            raise RuntimeError(f"injected batch fault at {request.session_id!r} block "
                               f"{request.block_index}")

    def _finish(self, requests, states,
                outputs: list[ardiff.BlockOutput]) -> list[ardiff.BlockOutput]:
        for request, state in zip(requests, states):
            if request.session_id == self.leave_open_session:
                state.block(BRANCH, commit=False).__enter__()
        return outputs[:-1] if self.drop_output else outputs


class RowBatchProbe(_BatchProbe):
    """`generate_blocks`: the one-session forward per row, through `states[i]`."""

    def generate_blocks(self, requests, states) -> list[ardiff.BlockOutput]:
        self.batch_calls.append([request.session_id for request in requests])
        outputs = []
        for request, state in zip(requests, states):
            self._batch_fault(request, state)
            outputs.append(self.generate_block(request, state))
        return self._finish(requests, states, outputs)


class AttendBatchProbe(_BatchProbe):
    """`generate_blocks`: every probe and the commit as one batched block (`states.block`)."""

    def generate_blocks(self, requests, states) -> list[ardiff.BlockOutput]:
        self.batch_calls.append([request.session_id for request in requests])
        starts = [state.num_committed_frames(BRANCH) for state in states]
        models = [self._model_state(r.session_id, start) for r, start in zip(requests, starts)]
        for state, model in zip(states, models):
            self._ensure_cross_kv(state, model)
        for request, state in zip(requests, states):
            self._batch_fault(request, state)
        for _ in range(requests[0].num_steps or self.num_steps):
            with states.block(BRANCH, commit=False) as blk:
                self._attend_rows(blk)
        with states.block(BRANCH, commit=True) as blk:
            self._attend_rows(blk)
            for request, start, visible in zip(requests, blk.start_frames, blk.visible_frames):
                self.blocks.append(BlockRecord(request.session_id, request.block_index, start,
                                               tuple(visible)))
        for request, model in zip(requests, models):
            self.hook_calls.append(("generate", request.session_id))
            model.blocks += 1
        return self._finish(requests, states, [self._output(r, self._frames(start))
                                               for r, start in zip(requests, starts)])

    def _attend_rows(self, blk) -> None:
        s, rows = self.spec, len(blk.start_frames)
        owns = [list(range(start, start + s.frames_per_block)) for start in blk.start_frames]
        q = torch.zeros(rows, s.frames_per_block * s.tokens_per_frame, s.num_kv_heads,
                        s.head_size, dtype=self.dtype, device=self.device)
        for layer in range(s.num_layers):
            v = torch.stack([torch.cat([self._frame_v(f, layer) for f in own])
                             for own in owns])  # [B, tokens, heads, head_size]
            out = blk.attend(layer, q, torch.zeros_like(v), v)
            for row, (visible, own) in enumerate(zip(blk.visible_frames, owns)):
                self._check(out[row], [*visible, *own], layer)

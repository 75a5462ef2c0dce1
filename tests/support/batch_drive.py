"""Drive a pipeline's batched forward beside its one-session forward, for equality tests.

    runner = batch_runner(pipeline, "paged", rows=8)
    schedule = ragged_schedule([0, 2, 5], num_batches=6, request=make_request)
    batched = run(runner, schedule, batched=True, tap=tap)    # Runner.execute_batch per batch
    single = run(batch_runner(...), schedule, batched=False, tap=tap)  # execute per request
    batched.frames["s1"]   ->  that session's blocks, one uint8 [F, H, W, 3] each
    batched.latents["s1"]  ->  what the tap saw of them (the float blocks before decoding)
    assert_rows_match(batched, single)   # the bound below

A schedule is a list of batches; a session appears at most once per batch and the sessions
of a batch may be at any block (ragged). Both arms see the same requests in the same order,
so any difference is the batching's. The bound, where kernels may differ (a batched matmul
is free to sum in another order): numerics.py's across kernels (`exact` is for the same
kernels: paged vs dense, a run repeated). A tap records the rows a pipeline decodes, in
request order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from numerics import FLOAT_RELATIVE, FRAME_LEVELS

from ardiff.contract.forward import RolloutRequest
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan

BUDGET_BYTES = 1 << 28
Schedule = list[list[RolloutRequest]]


class Tap(Protocol):
    def take(self) -> list[torch.Tensor]:
        """The rows decoded since the last take, in the order they were decoded."""


@dataclass
class Rollout:
    """Each session's blocks: frames (the outputs) and latents (what the tap saw)."""

    frames: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))
    latents: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))


def batch_runner(pipeline, backend: str, rows: int, sessions: int | None = None) -> Runner:
    """A CPU float32 runner whose plan holds `rows` sessions per forward (and `sessions`
    resident, default `rows`); the paged cache poisons free pages with NaN."""
    plan = make_plan(get_spec(pipeline), "float32", 4, BUDGET_BYTES,
                     max_sessions=sessions or rows, batch_rows=rows)
    return Runner(pipeline, create_cache(plan, backend, "cpu", poison=backend == "paged"))


def ragged_schedule(starts: list[int], num_batches: int,
                    request: Callable[[int, int], RolloutRequest]) -> Schedule:
    """Session i joins at batch starts[i] and then runs one block per batch; request(i, k)
    makes session i's block k. Batch b holds every session that has joined, in order."""
    return [[request(i, b - start) for i, start in enumerate(starts) if b >= start]
            for b in range(num_batches)]


def run(runner: Runner, schedule: Schedule, batched: bool, tap: Tap | None = None) -> Rollout:
    """Every request of `schedule`, one batch per forward (`batched`) or one request per
    forward, in schedule order, then close the runner (every session's close hook runs, so
    the pipeline may serve another runner)."""
    out = Rollout()
    try:
        for batch in schedule:
            if batched:
                results = runner.execute_batch(batch)
            else:
                results = [runner.execute(request) for request in batch]
            latents = tap.take() if tap is not None else [None] * len(batch)
            for request, result, latent in zip(batch, results, latents, strict=True):
                out.frames[request.session_id].append(result.output.frames)
                if latent is not None:
                    out.latents[request.session_id].append(latent)
    finally:
        runner.close()
    return out


def assert_rows_match(batched: Rollout, single: Rollout, exact: bool = False) -> None:
    """Every session's every block within the bound across kernels (`exact`: bit-equal, for
    the same kernels only)."""
    assert batched.frames.keys() == single.frames.keys()
    for session, blocks in single.frames.items():
        assert len(batched.frames[session]) == len(blocks)
        for index, (got, want) in enumerate(zip(batched.frames[session], blocks)):
            where = f"session {session} block {index}"
            assert got.shape == want.shape and got.dtype == want.dtype, where
            levels = (got.int() - want.int()).abs().max().item()
            assert levels <= (0 if exact else FRAME_LEVELS), f"{where}: {levels} levels apart"
        latents = zip(batched.latents[session], single.latents[session], strict=True)
        for index, (got, want) in enumerate(latents):
            error = (got - want).abs().max().item()
            bound = 0.0 if exact else FLOAT_RELATIVE * want.abs().max().item()
            assert error <= bound, f"session {session} block {index}: latents {error:.3g} apart"

"""The batched forward: several sessions' blocks in one `generate_blocks` (issue #26).

    outputs = forward_batch(pipeline, cache, requests, bind, stage)   # inside every bind
    raise batch_failure(requests, exc, stage)                          # one error names all

    binds:    enter A, enter B, enter C  ->  generate_blocks([A, B, C], KVStateBatch)
              exit C, exit B, exit A     ->  every state closed (a block left open: failed)

The runner (`Runner.execute_batch`) admits the sessions, times the forward and fails the
batch closed; this module runs it and says what went wrong, naming every session of it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack
from typing import Any, Callable, cast

from ardiff.contract import ARDiffusionPipeline
from ardiff.contract.forward import (
    BlockOutput,
    RolloutRequest,
    SupportsARDiffusionBatchGeneration,
)
from ardiff.errors import ArdiffError, BlockOutputError, CapacityError, PipelineError, SessionError
from ardiff.kv.backend import KVCacheBase
from ardiff.kv.batch import KVStateBatch
from ardiff.kv.state import KVState, open_state

Bind = Callable[[str, KVState], AbstractContextManager[None]]  # the runner's checked bind


def supports_batches(pipeline: object) -> bool:
    """Whether the pipeline runs several sessions in one forward (`generate_blocks`,
    `SupportsARDiffusionBatchGeneration`): a method, not None, defined by the same class as
    `generate_block` or a subclass of it. A subclass that overrides `generate_block` alone
    (a wrapper that logs, injects a fault, changes the output) would be bypassed by the
    inherited batched forward, so it runs one session per forward."""
    if not callable(getattr(pipeline, "generate_blocks", None)):
        return False
    batched, single = _definer(pipeline, "generate_blocks"), _definer(pipeline, "generate_block")
    if batched is None or single is None:  # set on the instance: taken as given
        return True
    return issubclass(batched, single)


def _definer(obj: object, name: str) -> type | None:
    """The class in `type(obj)`'s MRO whose body defines `name` (None: an instance attribute)."""
    for cls in type(obj).__mro__:
        if name in vars(cls):
            return cls
    return None


def check_batch(requests: list[RolloutRequest], capacity: int, batch_rows: int,
                reserved: str) -> None:
    """Refuse a batch before anything changes: a session twice or the `reserved` id
    (`SessionError`); more sessions than `capacity` can hold resident (a batch never evicts
    one of its own) or than the plan holds blocks in flight for (`batch_rows`):
    `CapacityError`."""
    seen: set[str] = set()
    for request in requests:
        sid = request.session_id
        if sid == reserved:
            raise SessionError(f"batch: session id {sid!r} is reserved for warmup; use "
                               f"another session_id")
        if sid in seen:
            raise SessionError(f"batch: session {sid!r} appears twice; a batch runs one "
                               f"block per session: send its next block in a later batch")
        seen.add(sid)
    if len(requests) > capacity:
        raise CapacityError(f"batch: {len(requests)} sessions in one forward, but the memory "
                            f"plan holds {capacity} resident (a batch never evicts one of its "
                            f"own); run at most {capacity} per batch or raise "
                            f"runtime.memory_budget")
    if len(requests) > batch_rows:
        raise CapacityError(f"batch: {len(requests)} sessions in one forward, but the memory "
                            f"plan holds blocks in flight for {batch_rows} (its batch_rows); "
                            f"run at most {batch_rows} per batch or plan for more "
                            f"(rollout.batch)")


def forward_batch(pipeline: ARDiffusionPipeline, cache: KVCacheBase[Any],
                  requests: list[RolloutRequest], bind: Bind,
                  stage: list[str], stage_times: list[dict[str, float]] | None = None,
                  ) -> list[BlockOutput]:
    """generate_blocks inside every session's bind (entered in request order, exited in
    reverse); every state is closed when the binds end, as the one-session forward closes
    its one. `stage[0]` says what runs (for the error). Returns one output per request
    (unchecked beyond the count); `stage_times` gets each state's `stage_s`."""
    states: list[KVState] = []
    raised: BaseException | None = None
    left_open: list[str] = []
    forward = cast(SupportsARDiffusionBatchGeneration, pipeline).generate_blocks
    try:
        with ExitStack() as binds:
            for request in requests:
                states.append(open_state(cache, request.session_id))
                binds.enter_context(bind(request.session_id, states[-1]))
            stage[0] = "generate_blocks"
            try:
                outputs = forward(requests, KVStateBatch(states))
            except BaseException as exc:
                raised = exc
                raise
            stage[0] = "bind_ar_diffusion_state"  # their exits
    finally:
        for state in states:
            left_open += [f"{what} (session {state.session_id!r})" for what in state.close()]
            if stage_times is not None:
                stage_times.append(dict(state.stage_s))
    stage[0] = "generate_blocks"  # what the errors below are about
    if raised is not None:  # a bind's __exit__ swallowed it: the blocks never finished
        raise PipelineError(f"a bind_ar_diffusion_state suppressed {type(raised).__name__}: "
                            f"{raised}; a bind must let the forward's exceptions "
                            f"through") from raised
    if left_open:
        raise PipelineError(f"returned with {' and '.join(left_open)} still open (entered, "
                            f"never exited); nothing of it was committed and its KV pages are "
                            f"back in the pool; enter KV blocks with `with states.block(...)` "
                            f"or `with states[i].block(...)`")
    return _one_per_request(outputs, len(requests))


def _one_per_request(outputs: object, count: int) -> list[BlockOutput]:
    if not isinstance(outputs, (list, tuple)) or len(outputs) != count:
        got = (f"{len(outputs)} outputs" if isinstance(outputs, (list, tuple))
               else f"a {type(outputs).__name__}")
        raise BlockOutputError(f"returned {got}; expected a list of {count} "
                               f"BlockOutput, one per request, in order")
    return list(outputs)


def batch_failure(requests: list[RolloutRequest], exc: BaseException,
                  stage: str) -> BaseException:
    """The error a failed batch raises: KeyboardInterrupt as it is (an interrupt); an ardiff
    error as its own class (its exit code) and `SystemExit` or anything else as a
    PipelineError, each prefixed with every session of the batch and its block."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    members = ", ".join(f"{r.session_id!r} block {r.block_index}" for r in requests)
    where = f"batch of {len(requests)} sessions ({members}): {stage}"
    if isinstance(exc, SystemExit):  # the pipeline must not end the process
        return PipelineError(f"{where} called exit({exc.code!r}); a pipeline must raise an "
                             f"exception, not exit the process")
    if isinstance(exc, ArdiffError):
        return _renamed(exc, f"{where}: {exc}")
    return PipelineError(f"{where} raised {type(exc).__name__}: {exc}; every session of the "
                         f"batch failed closed")


def _renamed(exc: ArdiffError, message: str) -> ArdiffError:
    """`exc`'s class with another message (a PipelineError where that class takes none)."""
    try:
        return type(exc)(message)
    except Exception:  # noqa: BLE001 - a subclass with another constructor
        return PipelineError(message)

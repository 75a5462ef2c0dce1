"""Small but real pipelines for the runner tests: they drive the KV state API for real.

Every forward runs `num_steps` probes and one commit on `main`, attends every layer, keeps
the prompt's K/V in the `text` cache and per-session model state. Each attend checks what the
cache served:

    k = 0, q = 0          -> uniform attention: out = mean of the visible v
    v of frame f, layer l = f + l / 2    (every token of the frame)

so `out` must be the mean over `blk.visible_frames` and the block's own frames (a page read
from the wrong place, or a poisoned one, shows). Frame f of the video is filled with f.
Loaded by path (`/abs/path/probe_pipeline.py:ProbePipeline`) or imported; the variants below
change one thing each.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

import ardiff

BRANCH = "main"
TEXT_CACHE = "text"
TEXT_TOKENS = 3

# 2 layers x 2 KV heads x 16 dims, 4 tokens per frame, blocks of 2 frames, a
# 4-frame window with a 1-frame sink: 3 frames (pages) of history per session.
PROBE_SPEC = dict(num_layers=2, num_kv_heads=2, head_size=16, tokens_per_frame=4,
                  frames_per_block=2, window_frames=4, sink_frames=1, session_capacity=8,
    kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))


class ProbeMismatch(RuntimeError):
    """The cache served K/V (or a session state) other than what the pipeline wrote."""


@dataclass
class BlockRecord:
    """What one commit block saw."""

    session_id: str
    block_index: int
    start_frame: int
    visible_frames: tuple[int, ...]


@dataclass
class SessionModelState:
    """Model-owned per-session state (what a streaming decoder would keep)."""

    blocks: int = 0
    cross_sets: int = 0


class _ProbeBase(ardiff.ARDiffusionPipelineBase):
    """The probe pipeline without warmup capability (see `ProbePipeline`)."""

    ar_diffusion_warmup_requests = None  # ProbePipeline below adds warmup

    def __init__(self, frame_size: int = 4, num_steps: int = 2, **spec_fields) -> None:
        self.frame_size, self.num_steps = frame_size, num_steps
        self.spec = ardiff.ARDiffusionKVCacheSpec(
            **{**PROBE_SPEC, **spec_fields},
            cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec(TEXT_CACHE, TEXT_TOKENS),))
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.load_calls: list[tuple[str, torch.dtype]] = []
        self.hook_calls: list[tuple[str, str]] = []   # ("reset" | "close" | "generate", session)
        self.bind_events: list[tuple[str, str]] = []  # ("enter" | "exit", session)
        self.bind_fault: str | None = None            # "enter" | "exit": the bind raises there
        self.last_bound_state = None
        self.blocks: list[BlockRecord] = []
        self.model_state: dict[str, SessionModelState] = {}

    # -- contract ------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return self.spec

    def load(self, device, dtype: torch.dtype) -> None:
        self.load_calls.append((str(device), dtype))
        self.device, self.dtype = torch.device(device), dtype

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self.hook_calls.append(("reset", session_id))
        self.model_state.pop(session_id, None)

    @contextlib.contextmanager
    def bind_ar_diffusion_state(self, session_id: str, state) -> Iterator[None]:
        """Records ("enter" | "exit", session) in `bind_events`, keeps the state it was last
        bound to in `last_bound_state`, and raises on enter or exit when `bind_fault` says so."""
        self.bind_events.append(("enter", session_id))
        self.last_bound_state = state
        if self.bind_fault == "enter":
            raise RuntimeError("injected bind fault on enter")
        try:
            yield
        finally:
            self.bind_events.append(("exit", session_id))
        if self.bind_fault == "exit":
            raise RuntimeError("injected bind fault on exit")

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self.hook_calls.append(("close", session_id))
        self.model_state.pop(session_id, None)

    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        sid = request.session_id
        self.hook_calls.append(("generate", sid))
        start = state.num_committed_frames(BRANCH)
        model = self._model_state(sid, start)
        self._ensure_cross_kv(state, model)
        for _ in range(request.num_steps or self.num_steps):
            with state.block(BRANCH, commit=False) as blk:
                self._attend_all(blk, request, "probe")
        with state.block(BRANCH, commit=True) as blk:
            self._attend_all(blk, request, "commit")
            self.blocks.append(BlockRecord(sid, request.block_index, blk.start_frame,
                                           tuple(blk.visible_frames)))
        self._fault(request, "after_commit")
        model.blocks += 1
        return self._output(request, self._frames(start))

    # -- the probe -------------------------------------------------------------------
    def _model_state(self, session_id: str, start_frame: int) -> SessionModelState:
        model = self.model_state.get(session_id)
        if start_frame == 0 and model is not None and model.blocks:
            raise ProbeMismatch(f"session {session_id!r}: KV restarted at frame 0 but the "
                                f"model state of {model.blocks} blocks survived (no hook?)")
        return self.model_state.setdefault(session_id, SessionModelState())

    def _ensure_cross_kv(self, state, model: SessionModelState) -> None:
        if state.cross_kv(BRANCH, TEXT_CACHE) is None:
            s = self.spec
            shape = (TEXT_TOKENS, s.num_kv_heads, s.head_size)
            pair = lambda: torch.ones(shape, dtype=self.dtype, device=self.device)  # noqa: E731
            state.set_cross_kv(BRANCH, TEXT_CACHE, [(pair(), pair()) for _ in range(s.num_layers)])
            model.cross_sets += 1
        layers = state.cross_kv(BRANCH, TEXT_CACHE)
        if len(layers) != self.spec.num_layers:
            raise ProbeMismatch(f"cross_kv returned {len(layers)} layers")

    def _attend_all(self, blk, request: ardiff.RolloutRequest, stage: str) -> None:
        s = self.spec
        tokens = blk.num_frames * s.tokens_per_frame
        q = torch.zeros(tokens, s.num_kv_heads, s.head_size, dtype=self.dtype, device=self.device)
        own = list(range(blk.start_frame, blk.start_frame + blk.num_frames))
        for layer in range(s.num_layers):
            self._fault(request, stage, layer, blk)
            v = torch.cat([self._frame_v(f, layer) for f in own])  # [tokens, heads, head_size]
            out = blk.attend(layer, q, torch.zeros_like(v), v)
            self._check(out, [*blk.visible_frames, *own], layer)

    def _frame_v(self, frame: int, layer: int) -> torch.Tensor:
        s = self.spec
        return torch.full((s.tokens_per_frame, s.num_kv_heads, s.head_size), frame + layer / 2,
                          dtype=self.dtype, device=self.device)

    def _check(self, out: torch.Tensor, frames: list[int], layer: int) -> None:
        expected = sum(frames) / len(frames) + layer / 2
        tolerance = 1e-4 if self.dtype == torch.float32 else 2e-2 * (1 + abs(expected))
        error = (out.float() - expected).abs().max().item()
        if not error <= tolerance:  # NaN (a poisoned page) fails too
            raise ProbeMismatch(f"layer {layer}: attention over frames {frames} gave "
                                f"{out.float().mean().item()}, expected {expected}")

    def _frames(self, start_frame: int) -> torch.Tensor:
        """[F, H, W, 3] uint8, each frame filled with its absolute index (mod 256)."""
        f, size = self.spec.frames_per_block, self.frame_size
        index = torch.arange(start_frame, start_frame + f) % 256
        return index.to(torch.uint8)[:, None, None, None].expand(f, size, size, 3).contiguous()

    def _fault(self, request: ardiff.RolloutRequest, stage: str, layer: int = 0,
               blk=None) -> None:
        """Variants raise here (before `layer` attends in `stage`, or `after_commit`)."""

    def _output(self, request: ardiff.RolloutRequest, frames: torch.Tensor):
        return ardiff.BlockOutput(frames=frames)


class NoWarmupPipeline(_ProbeBase):
    """A probe pipeline that does not implement `SupportsARDiffusionWarmup`."""


class ProbePipeline(_ProbeBase):
    """The probe pipeline with warmup: `warmup_blocks` blocks (3 fill the window and evict)."""

    def __init__(self, warmup_blocks: int = 3, **kwargs) -> None:
        super().__init__(**kwargs)
        self.warmup_blocks = warmup_blocks

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        return [ardiff.RolloutRequest(session_id, block_index=i, prompt="warmup", reset=i == 0)
                for i in range(self.warmup_blocks)]


class FailingForwardPipeline(ProbePipeline):
    """Raises in the forward of block `fail_at_block` (any session) at `fail_stage`.

    Stages: `probe` / `commit` (inside that block, at layer 1, so layer 0's K/V
    already sit in in-flight pages), `after_commit` (history already written),
    `bad_attend` (attends with a wrongly shaped k: ardiff's own KVStateError),
    `interrupt` (KeyboardInterrupt inside the commit block).
    """

    def __init__(self, fail_at_block: int | None = None, fail_stage: str = "commit",
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_at_block, self.fail_stage = fail_at_block, fail_stage

    def _fault(self, request: ardiff.RolloutRequest, stage: str, layer: int = 0,
               blk=None) -> None:
        if request.block_index != self.fail_at_block:
            return
        wanted = "commit" if self.fail_stage in ("bad_attend", "interrupt") else self.fail_stage
        if stage != wanted or layer != (0 if stage == "after_commit" else 1):
            return
        if self.fail_stage == "interrupt":
            raise KeyboardInterrupt
        if self.fail_stage == "bad_attend":
            s = self.spec
            k = torch.zeros(s.tokens_per_frame + 1, s.num_kv_heads, s.head_size, dtype=self.dtype)
            blk.attend(layer, k, k, k)  # wrong token count: raises KVStateError
        raise RuntimeError(f"injected fault at block {request.block_index} ({stage})")


class StaleBlockPipeline(ProbePipeline):
    """Keeps block `stale_at_block`'s commit block and attends through it after its `with`
    ended, as a buggy pipeline might (the pages behind it are history or free by then)."""

    def __init__(self, stale_at_block: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stale_at_block = stale_at_block
        self.kept_block = None

    def _attend_all(self, blk, request: ardiff.RolloutRequest, stage: str) -> None:
        super()._attend_all(blk, request, stage)
        if stage == "commit":
            self.kept_block = blk

    def generate_block(self, request: ardiff.RolloutRequest, state) -> ardiff.BlockOutput:
        output = super().generate_block(request, state)
        if request.block_index == self.stale_at_block:
            s = self.spec
            q = torch.zeros(1, s.num_kv_heads, s.head_size, dtype=self.dtype, device=self.device)
            k = torch.zeros(s.frames_per_block * s.tokens_per_frame, s.num_kv_heads,
                            s.head_size, dtype=self.dtype, device=self.device)
            self.kept_block.attend(0, q, k, k)
        return output


class FailingHooksPipeline(FailingForwardPipeline):
    """Its reset and/or close hooks drop their state, then raise (a half-failed cleanup)."""

    def __init__(self, fail_hooks: tuple[str, ...] | list[str] = ("close",), **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_hooks = tuple(fail_hooks)

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        super().reset_ar_diffusion_session(session_id)
        if "reset" in self.fail_hooks:
            raise RuntimeError(f"injected reset hook fault for {session_id!r}")

    def close_ar_diffusion_session(self, session_id: str) -> None:
        super().close_ar_diffusion_session(session_id)
        if "close" in self.fail_hooks:
            raise RuntimeError(f"injected close hook fault for {session_id!r}")


class FailingWarmupPipeline(ProbePipeline):
    """Warmup fails: `fail_in="requests"` (building them) or `"forward"` (the last forward)."""

    def __init__(self, fail_in: str = "forward", **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_in = fail_in

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        if self.fail_in == "requests":
            raise RuntimeError("injected fault building warmup requests")
        return super().ar_diffusion_warmup_requests(session_id)

    def _fault(self, request: ardiff.RolloutRequest, stage: str, layer: int = 0,
               blk=None) -> None:
        last = request.block_index == self.warmup_blocks - 1
        if self.fail_in == "forward" and last and stage == "commit" and layer == 1:
            raise RuntimeError("injected fault in a warmup forward")


class BadOutputPipeline(ProbePipeline):
    """Returns a broken `BlockOutput` at block `at_block` (its KV is written first).

    `bad`: dtype (float32 frames), channels ([F, H, W, 4]), dims ([H, W, 3]),
    empty (F = 0), not_output (a bare tensor), not_tensor (a list), size
    (H and W grow by 2).
    """

    def __init__(self, bad: str = "dtype", at_block: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad, self.at_block = bad, at_block

    def _output(self, request: ardiff.RolloutRequest, frames: torch.Tensor):
        if request.block_index != self.at_block:
            return ardiff.BlockOutput(frames=frames)
        broken = {
            "dtype": lambda: ardiff.BlockOutput(frames=frames.float()),
            "channels": lambda: ardiff.BlockOutput(frames=torch.cat([frames, frames[..., :1]], -1)),
            "dims": lambda: ardiff.BlockOutput(frames=frames[0]),
            "empty": lambda: ardiff.BlockOutput(frames=frames[:0]),
            "not_output": lambda: frames,
            "not_tensor": lambda: ardiff.BlockOutput(frames=frames.tolist()),
            "size": lambda: ardiff.BlockOutput(
                frames=torch.nn.functional.pad(frames, (0, 0, 1, 1, 1, 1))),
        }
        return broken[self.bad]()

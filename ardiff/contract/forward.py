"""ardiff's forward, beside the upstream contract: the request, the output, the KV state API.

    with pipeline.bind_ar_diffusion_state(request.session_id, state):   # upstream
        output = pipeline.generate_block(request, state)                  # ardiff

`SupportsARDiffusionBlockGeneration` is the one method ardiff adds to a
pipeline. `ARDiffusionKVState` and `ARDiffusionKVBlock` describe the state a
pipeline is handed (docs/design.md#2-the-contract), as protocols so plugin code can annotate
without importing the runtime; ardiff's implementation is `ardiff.kv.state`.

Optional, ardiff's own: `SupportsARDiffusionBatchGeneration.generate_blocks(requests,
states)`, one forward for several sessions. `states` is an `ARDiffusionKVStateBatch`: row i
is request i's own `ARDiffusionKVState`, and `states.block(...)` enters one block per row
whose `attend` takes `[B, ...]` and attends each row to its own session's history
(`ardiff.kv.batch`). A pipeline without it is run one session per forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    ContextManager,
    Iterator,
    Protocol,
    Sequence,
    TypeAlias,
    runtime_checkable,
)

from ardiff.errors import BlockOutputError

if TYPE_CHECKING:  # pragma: no cover - typing only; importing torch here would slow the CLI
    import torch

    from ardiff.contract.spec import ARDiffusionKVCacheSpec

# One (k, v) pair per layer, each [num_tokens, num_kv_heads, head_size].
CrossLayers: TypeAlias = list[tuple["torch.Tensor", "torch.Tensor"]]


@dataclass(frozen=True)
class RolloutRequest:
    """One call into the pipeline: produce the next AR block of one session.

    `reset` releases the session before the forward (the block starts at frame
    0); `close_session` releases it after a successful forward;
    `clear_cross_kv` drops its cross-attention K/V (e.g. on a prompt switch)
    and keeps its history. `actions` holds the per-frame or per-block
    conditioning of action models; `extra` is free for pipeline options.
    """

    session_id: str
    block_index: int = 0
    prompt: str = ""
    negative_prompt: str = ""
    seed: int = 0
    num_steps: int | None = None
    guidance_scale: float = 1.0
    actions: tuple[str, ...] | None = None
    reset: bool = False
    close_session: bool = False
    clear_cross_kv: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockOutput:
    """Decoded frames of one AR block: a `uint8` tensor `[F, H, W, 3]`."""

    frames: torch.Tensor  # [F, H, W, 3] uint8 (checked by `check`: a pipeline may pass anything)
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self, where: str) -> tuple[int, int]:
        """The frames' (H, W); raises `BlockOutputError` (prefixed by `where`) if they break
        the contract."""
        import torch

        frames = self.frames
        if not isinstance(frames, torch.Tensor):
            raise BlockOutputError(f"{where}.frames is a {type(frames).__name__}; expected a "
                                   f"uint8 tensor [F, H, W, 3]")
        if frames.dtype != torch.uint8:
            raise BlockOutputError(f"{where}.frames is {frames.dtype}; expected torch.uint8 "
                                   f"(decode and clamp to 0..255)")
        if frames.dim() != 4 or frames.shape[-1] != 3 or min(frames.shape[:3]) == 0:
            raise BlockOutputError(f"{where}.frames has shape {tuple(frames.shape)}; expected "
                                   f"[F > 0, H > 0, W > 0, 3]")
        return int(frames.shape[1]), int(frames.shape[2])


class ARDiffusionKVBlock(Protocol):
    """One block in flight on one branch (`with state.block(...) as blk`)."""

    @property
    def start_frame(self) -> int: ...

    @property
    def visible_frames(self) -> list[int]: ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None = None, extra_v: torch.Tensor | None = None,
               scale: float | None = None) -> torch.Tensor: ...


class ARDiffusionKVState(Protocol):
    """One session's KV as a pipeline sees it, valid only inside the bind."""

    session_id: str
    spec: ARDiffusionKVCacheSpec

    def num_committed_frames(self, branch: str) -> int: ...

    def block(self, branch: str, commit: bool = False,
              num_frames: int | None = None) -> ContextManager[ARDiffusionKVBlock]: ...

    def kept_frames(self, branch: str) -> list[int]: ...

    def recache(self, branch: str, start_frame: int,
                num_frames: int | None = None) -> ContextManager[ARDiffusionKVBlock]: ...

    def cross_kv(self, branch: str, name: str) -> CrossLayers | None: ...

    def set_cross_kv(self, branch: str, name: str, layers: CrossLayers) -> None: ...

    def clear_cross_kv(self, branch: str, names: list[str] | None = None) -> None: ...


@runtime_checkable
class SupportsARDiffusionBlockGeneration(Protocol):
    """ardiff's forward: one AR block of `request.session_id`, run inside the bind."""

    def generate_block(self, request: RolloutRequest,
                       state: ARDiffusionKVState) -> BlockOutput: ...


class ARDiffusionKVBatchBlock(Protocol):
    """One block per session of a batch, on one branch (`with states.block(...) as blk`).

    Row i is session i of the batch; rows may be at different positions and hold histories
    of different lengths (ragged is the normal case)."""

    @property
    def start_frames(self) -> list[int]: ...

    @property
    def visible_frames(self) -> list[list[int]]: ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None = None, extra_v: torch.Tensor | None = None,
               scale: float | None = None) -> torch.Tensor:
        """q: [B, q_tokens, q_heads, hs]; k, v: [B, num_frames * tokens_per_frame,
        kv_heads, hs]; extra_k/v: [B, n, kv_heads, hs]. Returns [B, q_tokens, q_heads, hs]:
        row i attended to row i's visible history + its own block (+ its registers)."""
        ...


class ARDiffusionKVStateBatch(Protocol):
    """The states of a batch's sessions, in the order of its requests, valid only inside the
    forward. Per-session work (cross K/V, a recache, `num_committed_frames`) goes through
    `states[i]`; `block` opens the same block on every row at once."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> ARDiffusionKVState: ...

    def __iter__(self) -> Iterator[ARDiffusionKVState]: ...

    def block(self, branch: str, commit: bool = False,
              num_frames: int | None = None) -> ContextManager[ARDiffusionKVBatchBlock]: ...


@runtime_checkable
class SupportsARDiffusionBatchGeneration(Protocol):
    """ardiff's optional batched forward: the next AR block of every request's session in
    one forward, run inside every session's bind (entered in the requests' order). Returns
    one `BlockOutput` per request, in order. Requests may differ in prompt, seed, block
    index, actions and guidance; sessions may be at different positions."""

    def generate_blocks(self, requests: Sequence[RolloutRequest],
                        states: ARDiffusionKVStateBatch) -> list[BlockOutput]: ...

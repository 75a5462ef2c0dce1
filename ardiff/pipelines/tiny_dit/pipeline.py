"""`TinyCausalDiT`: the tiny DiT (`model.py`) as a text-to-video pipeline.

    block:    num_steps flow-matching steps, each a probe of every branch it runs, then one
              commit forward over the clean block (t = 0) whose K/V become history
    CFG:      guidance_scale > 1 runs `positive` and `negative` branches (declared when
              cfg=True) and mixes their predictions; under CFG-parallel
              (`runtime.parallel.cfg: 2`) each rank runs one branch and all-gathers the
              other's prediction every step (ardiff.distributed.context)
    video:    `LatentDecoder`, with the previous latent frame as per-session state
    prompt:   its K/V are the session's "text" cross-attention cache, set on a new prompt;
              one token per UTF-8 byte, `text_tokens` of them (`max_prompt_tokens`)
    batch:    `generate_blocks` runs B sessions' blocks as one: each forward takes every
              row that runs its branch (rows with the same step count step together);
              `generate_block` is the batch of one (`shared/rows.py`)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

import ardiff
from ardiff.contract.base import warmup_requests
from ardiff.contract.forward import CrossLayers
from ardiff.dtypes import torch_dtype
from ardiff.pipelines.shared.nn import parameter_bytes
from ardiff.pipelines.shared.rows import OneRow, as_rows, group_rows, put, subset, take
from ardiff.pipelines.shared.sampling import rows_noise, sample
from ardiff.pipelines.tiny_dit.decoder import LatentDecoder
from ardiff.pipelines.tiny_dit.model import TinyDiT, TinyDiTConfig
from ardiff.pipelines.tiny_dit.reference import TinyDiTLoop

TEXT_CACHE = "text"
BRANCH_ORDER = ("main", "positive", "negative")  # a row's branches run (and commit) in this order


class TinyCausalDiT(ardiff.ARDiffusionPipelineBase):
    """The reference text-to-video pipeline: one branch, or two under CFG."""

    ardiff_inputs = ardiff.PipelineInputs(prompt="accepted")

    def __init__(self, **config) -> None:
        self.config = TinyDiTConfig(**config)
        self.model: TinyDiT | None = None
        self.decoder: LatentDecoder | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._decoder_state: dict[str, torch.Tensor] = {}   # model-owned, per session
        self._prompts: dict[tuple[str, str], str] = {}      # (session, branch) -> cached prompt
        self.parallel: ardiff.ParallelContext | None = None  # CFG-parallel: this rank's branch
        self._compiler = None                               # set by compile_layers

    # -- contract ------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        c = self.config
        return ardiff.ARDiffusionKVCacheSpec(
            num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_size=c.head_size,
            tokens_per_frame=c.tokens_per_frame, frames_per_block=c.frames_per_block,
            window_frames=c.window_frames, sink_frames=c.sink_frames,
            reset_at_boundary=c.reset_at_boundary, session_capacity=c.session_capacity,
            max_model_len=c.max_frames,
            kv_branches=self._branch_specs(),
            cross_attention=(ardiff.ARDiffusionCrossAttentionKVSpec(TEXT_CACHE, c.text_tokens),),
            model_owned_state_bytes_per_session=LatentDecoder.state_bytes(c.latent_channels,
                                                                          c.latent_size),
        )

    @property
    def max_prompt_tokens(self) -> int:
        """The text length: a prompt's UTF-8 bytes past it are cut (`text.tokenize`)."""
        return self.config.text_tokens

    def count_prompt_tokens(self, prompt: str) -> int:
        """Tokens of `prompt` before the cut: one per UTF-8 byte."""
        return len(prompt.encode("utf-8"))

    def weight_bytes(self, dtype: str) -> dict[str, int]:
        """The transformer's and the decoder's parameters in the run's dtype (counted)."""
        c, size = self.config, torch_dtype(dtype)
        return {"transformer": parameter_bytes(lambda: TinyDiT(c), size),
                "decoder": parameter_bytes(lambda: LatentDecoder(c.latent_channels, c.upscale),
                                           size)}

    def load(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """Build the weights from `weights_seed` (no download) and move them to the device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.weights_seed)
            model = TinyDiT(self.config)
            decoder = LatentDecoder(self.config.latent_channels, self.config.upscale)
        self.device, self.dtype = torch.device(device), dtype
        self.model = model.to(self.device, dtype).eval()
        self.decoder = decoder.to(self.device, dtype).eval()
        if self._compiler is not None:
            self._compile()

    def compile_layers(self, compiler) -> None:
        """Compile the layer stack (`TinyDiT.layers`) with `compiler`, e.g. `torch.compile`;
        each self-attention in it stays one `ardiff::paged_attend` call."""
        self._compiler = compiler
        if self.model is not None:
            self._compile()

    def _compile(self) -> None:
        self.model.layers = self._compiler(TinyDiT.layers.__get__(self.model))

    def bind_ar_diffusion_parallel(self, context: ardiff.ParallelContext) -> None:
        """Run only `context.branch` of the CFG pair; the other rank runs the other one."""
        self.parallel = context

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Enough blocks to fill the window and evict once, with guidance when CFG is on."""
        return warmup_requests(self.ar_diffusion_kv_cache_spec(), session_id, self.config.cfg)

    def reference_loop(self, spec: ardiff.ARDiffusionKVCacheSpec) -> TinyDiTLoop | str:
        """`ardiff bench`'s reference arm: a fresh hand-written loop over these weights with
        `spec`'s window and sink (`reference.py`), or why there is none."""
        if self.config.cfg:
            return "the tiny DiT's reference loop runs one branch (pipeline.args.cfg: false)"
        window = {"window_frames": spec.window_frames, "sink_frames": spec.sink_frames}
        return TinyDiTLoop(self, dataclasses.replace(self.config, **window))

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        return self.generate_blocks([request], OneRow(state))[0]

    @torch.inference_mode()
    def generate_blocks(self, requests: Sequence[ardiff.RolloutRequest],
                        states: ardiff.ARDiffusionKVStateBatch) -> list[ardiff.BlockOutput]:
        """The next block of every request's session: each step one probe forward per
        branch over the rows that run it (rows with the same step count sample together),
        then one commit forward per branch, then one decode of every row."""
        if self.model is None:
            self.load("cpu", torch.float32)
        block = self._rows(requests, as_rows(states, len(requests)))
        c = self.config
        shape = (c.frames_per_block, c.latent_channels, c.latent_size, c.latent_size)
        noise = rows_noise(shape, [r.seed for r in requests], block.start_frames(),
                           self.device, self.dtype)
        parts = {}
        for steps, rows in group_rows([r.num_steps or c.num_steps for r in requests]).items():
            part = block.part(rows)
            x = sample(take(noise, rows, len(requests)),
                       lambda x, t, part=part: self._predict_clean(part, x, t), steps)
            parts[steps] = (rows, x)
        x = put(parts, len(requests))  # [B, F, C, h, w]
        for branch, rows in block.branch_rows().items():  # the clean blocks become history
            with subset(block.states, rows).block(branch, commit=True) as blk:
                self.model(take(x, rows, len(requests)), 0.0, blk, block.cross(branch, rows))
        sessions = [request.session_id for request in requests]
        frames, decoded = self.decoder.decode_rows(x, [self._decoder_state.get(session)
                                                       for session in sessions])
        self._decoder_state.update(zip(sessions, decoded))
        return [ardiff.BlockOutput(frames=row_frames) for row_frames in frames]

    # -- helpers -------------------------------------------------------------------
    def _branch_specs(self) -> tuple[ardiff.ARDiffusionKVBranchSpec, ...]:
        if not self.config.cfg:
            return (ardiff.ARDiffusionKVBranchSpec("main", 0),)
        return ardiff.cfg_branch_specs(1 if self.parallel is None else self.parallel.world_size)

    def _is_split(self) -> bool:
        return self.parallel is not None and self.parallel.world_size > 1

    def _branches(self, request: ardiff.RolloutRequest) -> tuple[str, ...]:
        if request.guidance_scale > 1.0 and not self.config.cfg:
            raise ardiff.ConfigError(f"rollout.guidance_scale: {request.guidance_scale} needs "
                                     f"the negative branch; set pipeline.args.cfg: true")
        if self.config.cfg and request.guidance_scale > 1.0:
            return (self.parallel.branch,) if self._is_split() else ("positive", "negative")
        return (self.config.branch_names[0],)

    def _rows(self, requests: Sequence[ardiff.RolloutRequest],
              states: ardiff.ARDiffusionKVStateBatch) -> BatchRows:
        branches = [self._branches(request) for request in requests]
        cross = [{b: self._text_kv(state, request, b) for b in row_branches}
                 for state, request, row_branches in zip(states, requests, branches)]
        return BatchRows(list(requests), states, branches, cross)

    def _text_kv(self, state, request: ardiff.RolloutRequest, branch: str):
        prompt = request.negative_prompt if branch == "negative" else request.prompt
        key = (request.session_id, branch)
        if self._prompts.get(key) != prompt or state.cross_kv(branch, TEXT_CACHE) is None:
            state.set_cross_kv(branch, TEXT_CACHE, self.model.text_kv(prompt))
            self._prompts[key] = prompt
        return state.cross_kv(branch, TEXT_CACHE)

    def _predict_clean(self, block: BatchRows, x: torch.Tensor, t: float) -> torch.Tensor:
        """Every row's clean prediction for x [B, F, C, h, w] at level t: a probe of each
        branch over the rows that run it, guidance mixed where a row asks for it."""
        num_rows = len(block.requests)
        predictions = {}
        for branch, rows in block.branch_rows().items():  # probes: commit nothing
            with subset(block.states, rows).block(branch, commit=False) as blk:
                predictions[branch] = (rows, self.model(take(x, rows, num_rows), t, blk,
                                                        block.cross(branch, rows)))
        scales = [request.guidance_scale for request in block.requests]
        guided = [row for row, scale in enumerate(scales) if scale > 1.0]
        unguided = [row for row, scale in enumerate(scales) if scale <= 1.0]
        parts = {}
        if unguided:
            parts["unguided"] = (unguided, pick(predictions[self.config.branch_names[0]],
                                                unguided))
        if guided and self._is_split():  # both ranks' predictions of the guided rows
            positive, negative = self.parallel.all_gather(
                pick(predictions[self.parallel.branch], guided))
        elif guided:
            positive, negative = (pick(predictions[b], guided) for b in ("positive", "negative"))
        for scale, rows in group_rows([scales[row] for row in guided]).items():
            pos, neg = (take(p, rows, len(guided)) for p in (positive, negative))
            parts[scale] = ([guided[row] for row in rows], neg + scale * (pos - neg))
        return put(parts, num_rows)

    def _forget(self, session_id: str) -> None:
        self._decoder_state.pop(session_id, None)
        for key in [k for k in self._prompts if k[0] == session_id]:
            del self._prompts[key]


def pick(prediction: tuple[list[int], torch.Tensor], rows: list[int]) -> torch.Tensor:
    """Rows `rows` of a prediction made for rows `prediction[0]`."""
    made_for, x = prediction
    return take(x, [made_for.index(row) for row in rows], len(made_for))


@dataclass
class BatchRows:
    """One block's rows as the tiny DiT runs them: each row's request, state, branches (in
    BRANCH_ORDER) and prompt K/V per branch."""

    requests: list[ardiff.RolloutRequest]
    states: ardiff.ARDiffusionKVStateBatch
    branches: list[tuple[str, ...]]
    text: list[dict[str, CrossLayers]]
    _stacked: dict[tuple[str, tuple[int, ...]], CrossLayers] = field(default_factory=dict)

    def start_frames(self) -> list[int]:
        """Each row's block position (that of its first branch: a row's guidance may have
        started later than its session, leaving its negative branch behind)."""
        return [state.num_committed_frames(branches[0])
                for state, branches in zip(self.states, self.branches)]

    def part(self, rows: list[int]) -> BatchRows:
        """Rows `rows` alone, in that order."""
        if rows == list(range(len(self.requests))):
            return self
        return BatchRows([self.requests[r] for r in rows], subset(self.states, rows),
                         [self.branches[r] for r in rows], [self.text[r] for r in rows])

    def branch_rows(self) -> dict[str, list[int]]:
        """{branch: the rows that run it}, branches in BRANCH_ORDER."""
        found = {branch: [row for row, branches in enumerate(self.branches) if branch in branches]
                 for branch in BRANCH_ORDER}
        return {branch: rows for branch, rows in found.items() if rows}

    def cross(self, branch: str, rows: list[int]) -> CrossLayers:
        """Per layer the prompt K/V of `rows` on `branch`, stacked: [B, L, kv_heads, hs]."""
        key = (branch, tuple(rows))
        if key not in self._stacked:
            per_row = [self.text[row][branch] for row in rows]
            self._stacked[key] = [
                tuple(parts[0][None] if len(rows) == 1 else torch.stack(parts)
                      for parts in zip(*(layers[layer] for layers in per_row)))
                for layer in range(len(per_row[0]))]
        return self._stacked[key]

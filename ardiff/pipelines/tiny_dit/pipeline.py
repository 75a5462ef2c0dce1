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
"""

from __future__ import annotations

import dataclasses

import torch

import ardiff
from ardiff.contract.base import warmup_requests
from ardiff.pipelines.shared.sampling import block_noise, sample
from ardiff.pipelines.tiny_dit.decoder import LatentDecoder
from ardiff.pipelines.tiny_dit.model import TinyDiT, TinyDiTConfig
from ardiff.pipelines.tiny_dit.reference import TinyDiTLoop

TEXT_CACHE = "text"


class TinyCausalDiT(ardiff.ARDiffusionPipelineBase):
    """The reference text-to-video pipeline: one branch, or two under CFG."""

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
        if self.model is None:
            self.load("cpu", torch.float32)
        branches = self._branches(request)
        cross = {b: self._text_kv(state, request, b) for b in branches}
        c = self.config
        shape = (c.frames_per_block, c.latent_channels, c.latent_size, c.latent_size)
        noise = block_noise(shape, request.seed, state.num_committed_frames(branches[0]),
                            self.device, self.dtype)
        x = sample(noise, lambda x, t: self._predict_clean(state, branches, cross, x, t, request),
                   request.num_steps or c.num_steps)
        for branch in branches:  # commit: the clean block's K/V become history
            with state.block(branch, commit=True) as blk:
                self.model(x, 0.0, blk, cross[branch])
        frames, self._decoder_state[request.session_id] = self.decoder(
            x, self._decoder_state.get(request.session_id))
        return ardiff.BlockOutput(frames=frames)

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

    def _text_kv(self, state, request: ardiff.RolloutRequest, branch: str):
        prompt = request.negative_prompt if branch == "negative" else request.prompt
        key = (request.session_id, branch)
        if self._prompts.get(key) != prompt or state.cross_kv(branch, TEXT_CACHE) is None:
            state.set_cross_kv(branch, TEXT_CACHE, self.model.text_kv(prompt))
            self._prompts[key] = prompt
        return state.cross_kv(branch, TEXT_CACHE)

    def _predict_clean(self, state, branches, cross, x, t, request) -> torch.Tensor:
        predictions = []
        for branch in branches:  # probes: attend to history, commit nothing
            with state.block(branch, commit=False) as blk:
                predictions.append(self.model(x, t, blk, cross[branch]))
        if self._is_split() and request.guidance_scale > 1.0:
            predictions = self.parallel.all_gather(predictions[0])  # [positive, negative]
        if len(predictions) == 1:
            return predictions[0]
        positive, negative = predictions
        return negative + request.guidance_scale * (positive - negative)

    def _forget(self, session_id: str) -> None:
        self._decoder_state.pop(session_id, None)
        for key in [k for k in self._prompts if k[0] == session_id]:
            del self._prompts[key]

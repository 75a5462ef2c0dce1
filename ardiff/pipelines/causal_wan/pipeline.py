"""`CausalWan`: the Self-Forcing / CausVid / LongLive family on diffusers, from local weights.

One AR block (`frames_per_block` latent frames) of one session:

    (on_switch: recache) re-encode the kept frames' K/V under the new prompt (recache.py)
    x = noise(step 0)
    for each step k at timestep t_k:            probes: attend to history, commit nothing
        v  = transformer(x, t_k)                (CFG: v_neg + g (v_pos - v_neg))
        x0 = x - sigma(t_k) v                   (float64)
        x  = (1 - sigma(t_k+1)) x0 + sigma(t_k+1) noise(step k+1)   unless k is the last
    transformer(x0, t = 0), commit=True         the clean block's K/V become history
    frames = streaming VAE decode of x0         (1 + 4 (F - 1) frames first, then 4 F)

Attention goes through ardiff's KV state (processors.py) at absolute frame positions; the
prompt's K/V are the session's "text" cache. `noise` is a public hook a subclass may change.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

import ardiff
from ardiff.contract.base import warmup_requests
from ardiff.errors import ConfigError, KVStateError
from ardiff.pipelines.causal_wan.config import build_config
from ardiff.pipelines.causal_wan.decode import StreamingDecoder
from ardiff.pipelines.causal_wan.models import load_transformer, load_vae, quiet_libraries
from ardiff.pipelines.causal_wan.recache import RECACHE, KeptLatents, recache_branch
from ardiff.pipelines.causal_wan.schedule import clean_from_flow, renoise
from ardiff.pipelines.causal_wan.spec import TEXT_CACHE, build_spec
from ardiff.pipelines.causal_wan.text import PromptEncoder
from ardiff.pipelines.causal_wan.transformer import BlockTransformer


class CausalWan(ardiff.ARDiffusionPipelineBase):
    """A causal Wan2.1 text-to-video pipeline (implements the ardiff pipeline protocol).

    Construction reads `model_dir`'s transformer/ and vae/ config.json only; `load`
    imports diffusers and transformers and reads the weights. See `build_config` for
    the arguments."""

    def __init__(self, **args) -> None:
        self.config = build_config(**args)
        self.video_frames_per_latent_frame = self.config.vae.temporal_factor
        # The first latent frame of a session decodes to one video frame (a first block of
        # F latent frames gives 1 + 4 (F - 1)): the rollout planner reads both attributes.
        self.video_frames_first_latent_frame = 1
        self.transformer: BlockTransformer | None = None
        self.prompt_encoder: PromptEncoder | None = None
        self.decoder: StreamingDecoder | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._bound_session: str | None = None
        self._prompts: dict[tuple[str, str], str] = {}  # (session, branch) -> cached prompt
        self.kept_latents = KeptLatents()  # clean latents of the kept frames, for a recache

    # -- contract ------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return build_spec(self.config)

    @property
    def max_prompt_tokens(self) -> int:
        """The text length (`text_len`): UMT5 tokens past it are cut (`text.PromptEncoder`)."""
        return self.config.text_len

    def count_prompt_tokens(self, prompt: str) -> int | None:
        """UMT5 tokens of `prompt` before the cut, its end token included; None before `load`."""
        if self.prompt_encoder is None:
            return None
        return len(self.prompt_encoder.tokenizer(prompt, add_special_tokens=True).input_ids)

    def load(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """Read every model from `model_dir` (local files only) onto `device`."""
        quiet_libraries()
        self.device, self.dtype = torch.device(device), dtype
        c = self.config
        self.transformer = BlockTransformer(load_transformer(c, self.device, dtype))
        self.prompt_encoder = PromptEncoder.load(c.model_dir, c.text_len, self.device, dtype)
        self.decoder = StreamingDecoder(load_vae(c, self.device))

    @contextlib.contextmanager
    def bind_ar_diffusion_state(self, session_id: str,
                                state: ardiff.ARDiffusionKVState) -> Iterator[None]:
        """Marks the session whose forward may run; the KV block itself is bound per
        forward, for the processors (`AttentionBinding`)."""
        self._bound_session = session_id
        try:
            yield
        finally:
            self._bound_session = None

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def ar_diffusion_input_paths(self) -> dict[str, Path | None]:
        """What `load` reads: the model folder, the checkpoint and the LoRA (no output may be
        one of them, nor a file inside the folder)."""
        c = self.config
        return {"pipeline.args.model_dir": c.model_dir,
                "pipeline.args.generator_ckpt": c.generator_ckpt,
                "pipeline.args.lora_ckpt": c.lora_ckpt}

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Enough blocks to fill the window and evict once, with guidance when CFG is on."""
        return warmup_requests(self.ar_diffusion_kv_cache_spec(), session_id, self.config.cfg)

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        self._check_ready(request)
        branches = self._branches(request)
        cross = {b: self._text_kv(state, request, b) for b in branches}
        if request.extra.get(RECACHE):
            for branch in branches:
                recache_branch(self.transformer, state, branch, self.kept_latents,
                               cross[branch], self.device, self.dtype)
        clean = self._denoise(request, state, branches, cross)  # [1, C, F, h, w] float32
        self._commit(state, branches, cross, clean)
        frames = self.decoder.decode(request.session_id, clean)
        return ardiff.BlockOutput(frames=frames.cpu(), extra={"latents": clean})

    def _commit(self, state, branches, cross, clean: torch.Tensor) -> None:
        """The clean block's K/V become history; its latents are kept while its frames are."""
        kept: set[int] = set()
        starts = set()
        for branch in branches:
            with state.block(branch, commit=True) as blk:
                starts.add(blk.start_frame)
                self.transformer.flow(clean.to(self.device, self.dtype), 0.0, blk,
                                      cross[branch])
            kept.update(state.kept_frames(branch))
        if len(starts) != 1:  # a bug: the branches commit together, block for block
            raise KVStateError(f"causal-wan: branches {list(branches)} are at frames "
                               f"{sorted(starts)}; they must commit in step")
        self.kept_latents.record(state.session_id, starts.pop(), clean, sorted(kept))

    # -- the noise hook --------------------------------------------------------------
    def noise(self, seed: int, block_index: int, step: int, shape: tuple[int, ...],
              device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Standard normal noise for one block: step 0 is the block's initial noise, step
        k the re-noise before step k. Drawn in float32 on the CPU from a stream named by
        (seed, block_index, step), so it is the same on every device. Override to change."""
        stream = np.random.SeedSequence([seed, block_index, step]).generate_state(1, np.uint64)
        generator = torch.Generator().manual_seed(int(stream[0]) >> 1)
        return torch.randn(shape, generator=generator).to(device, dtype)

    # -- helpers -------------------------------------------------------------------
    def _check_ready(self, request: ardiff.RolloutRequest) -> None:
        if self.transformer is None:
            raise KVStateError("causal-wan: generate_block before load(device, dtype); the "
                               "runner loads the pipeline first")
        if self._bound_session != request.session_id:
            raise KVStateError(f"causal-wan: generate_block for session "
                               f"{request.session_id!r} outside its bind_ar_diffusion_state")

    def _branches(self, request: ardiff.RolloutRequest) -> tuple[str, ...]:
        guided = request.guidance_scale > 1.0
        if guided and not self.config.cfg:
            raise ConfigError(f"rollout.guidance_scale: {request.guidance_scale} needs the "
                              f"negative branch; set pipeline.args.cfg: true (the distilled "
                              f"Self-Forcing / CausVid / LongLive models run without guidance)")
        # With CFG declared every block commits to both branches, guided or not, so their
        # histories (and positions) stay in step; an unguided block predicts with the first.
        return tuple(self.config.branch_names)

    def _timesteps(self, request: ardiff.RolloutRequest) -> list[float]:
        timesteps = self.config.timesteps()
        if request.num_steps is not None and request.num_steps != len(timesteps):
            steps = list(self.config.denoising_steps)
            raise ConfigError(f"rollout.num_steps: {request.num_steps} differs from the "
                              f"{len(steps)} denoising steps {steps} of preset "
                              f"{self.config.preset.name!r}; leave it unset or set "
                              f"pipeline.args.denoising_steps")
        return timesteps

    def _text_kv(self, state, request: ardiff.RolloutRequest, branch: str):
        prompt = request.negative_prompt if branch == "negative" else request.prompt
        key = (request.session_id, branch)
        if self._prompts.get(key) != prompt or state.cross_kv(branch, TEXT_CACHE) is None:
            embeds = self.prompt_encoder.encode(prompt).to(self.device, self.dtype)
            state.set_cross_kv(branch, TEXT_CACHE, self.transformer.text_kv(embeds))
            self._prompts[key] = prompt
        return state.cross_kv(branch, TEXT_CACHE)

    def _denoise(self, request, state, branches, cross) -> torch.Tensor:
        """The block's clean latents [1, C, F, h, w] (float32) after every denoising step."""
        timesteps, table = self._timesteps(request), self.config.preset.table
        shape, seed, block = self.config.latent_shape, request.seed, request.block_index
        x = self.noise(seed, block, 0, shape, self.device, torch.float32)
        for step, timestep in enumerate(timesteps):
            flow = self._flow(state, branches, cross, x, timestep, request.guidance_scale)
            clean = clean_from_flow(x, flow, table.sigma(timestep))
            if step + 1 < len(timesteps):
                noise = self.noise(seed, block, step + 1, shape, self.device, torch.float32)
                x = renoise(clean, noise, table.sigma(timesteps[step + 1]))
        return clean

    def _flow(self, state, branches, cross, x, timestep, guidance_scale) -> torch.Tensor:
        flows = []
        if guidance_scale <= 1.0:
            branches = branches[:1]  # the positive prediction alone; both branches commit
        for branch in branches:  # probes: attend to history, commit nothing
            with state.block(branch, commit=False) as blk:
                flows.append(self.transformer.flow(x.to(self.dtype), timestep, blk,
                                                   cross[branch]).float())
        if len(flows) == 1:
            return flows[0]
        positive, negative = flows
        return negative + guidance_scale * (positive - negative)

    def _forget(self, session_id: str) -> None:
        if self.decoder is not None:
            self.decoder.forget(session_id)
        self.kept_latents.forget(session_id)
        for key in [k for k in self._prompts if k[0] == session_id]:
            del self._prompts[key]

"""`CausalWan`: the Self-Forcing / CausVid / LongLive family on diffusers, from local weights.

One AR block (`frames_per_block` latent frames) of each of B sessions (`generate_blocks`;
`generate_block` is a batch of one), the B rows in one transformer forward per step:

    (on_switch: recache) LongLive's recache: the last frames re-run, new prompt (recache.py),
                         session by session, before the batched steps
    x = noise(step 0)                           each row its own (seed, block_index, step)
    for each step k at timestep t_k:            probes: attend to history, commit nothing
        v  = transformer(x, t_k)                (CFG: v_neg + g (v_pos - v_neg), rows g > 1)
        x0 = x - sigma(t_k) v                   (float64)
        x  = (1 - sigma(t_k+1)) x0 + sigma(t_k+1) noise(step k+1)   unless k is the last
    transformer(x0, t = 0), commit=True         the clean blocks' K/V become history
    frames = streaming VAE decode of x0         per session (1 + 4 (F - 1) frames first, then 4 F)

Attention goes through ardiff's KV state (processors.py) at each row's absolute frame
positions; a prompt's K/V are its session's "text" cache. Per session the pipeline keeps
its decoder cache, its kept latents and its cached prompts. `noise` is a public hook a
subclass may change.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterator, Sequence

import numpy as np
import torch

import ardiff
from ardiff.contract.base import warmup_requests
from ardiff.errors import ConfigError, KVStateError
from ardiff.pipelines.causal_wan.config import build_config
from ardiff.pipelines.causal_wan.decode import StreamingDecoder
from ardiff.pipelines.causal_wan.models import load_transformer, load_vae, quiet_libraries
from ardiff.pipelines.causal_wan.prompt_clean import clean_prompt, require_ftfy
from ardiff.pipelines.causal_wan.recache import RECACHE, KeptLatents, recache_branch
from ardiff.pipelines.causal_wan.schedule import clean_from_flow, renoise
from ardiff.pipelines.causal_wan.spec import TEXT_CACHE, build_spec
from ardiff.pipelines.causal_wan.text import PromptEncoder
from ardiff.pipelines.causal_wan.transformer import BlockTransformer
from ardiff.pipelines.causal_wan.weight_sizes import ACTIVATION_BYTES, weight_bytes
from ardiff.pipelines.shared.rows import OneRow, as_rows, group_rows, put, subset, take


class CausalWan(ardiff.ARDiffusionPipelineBase):
    """A causal Wan2.1 text-to-video pipeline (implements the ardiff pipeline protocol).

    Construction reads `model_dir`'s transformer/ and vae/ config.json only; `load`
    imports diffusers and transformers and reads the weights. See `build_config` for
    the arguments."""

    ardiff_inputs = ardiff.PipelineInputs(prompt="accepted")

    def __init__(self, **args) -> None:
        self.config = build_config(**args)
        self.model_layout = self.config.layout  # "diffusers" or "wan" (layouts.py)
        self.video_frames_per_latent_frame = self.config.vae.temporal_factor
        # The first latent frame of a session decodes to one video frame (a first block of
        # F latent frames gives 1 + 4 (F - 1)): the rollout planner reads both attributes.
        self.video_frames_first_latent_frame = 1
        self.transformer: BlockTransformer | None = None
        self.prompt_encoder: PromptEncoder | None = None
        self.decoder: StreamingDecoder | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._bound_sessions: list[str] = []  # every bind entered (a batch: all its sessions)
        self._prompts: dict[tuple[str, str], str] = {}  # (session, branch) -> cached prompt
        self.kept_latents = KeptLatents()  # clean latents of the frames a recache re-runs
        self._text_encoder_device: str | None = None  # place_weights' choice for `auto`

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
        tokens = self.prompt_encoder.tokenizer(clean_prompt(prompt), add_special_tokens=True)
        return len(tokens.input_ids)

    def activation_bytes(self, dtype: str) -> int:
        """The estimate ardiff's fit keeps for one block's activations (`ACTIVATION_BYTES`)."""
        return ACTIVATION_BYTES

    def weight_bytes(self, dtype: str) -> dict[str, int]:
        """Bytes of the transformer, UMT5 and the VAE once loaded in `dtype`, counted from
        the configs (weight_sizes.py): nothing is read but config files."""
        return weight_bytes(self.config, dtype)

    def place_weights(self, device: str, fits: Callable[[Collection[str]], bool]
                      ) -> dict[str, str]:
        """The transformer and the VAE on `device`; UMT5 where `text_encoder_device` says,
        `auto`: on `device` if all three fit there beside the KV plan, else on the CPU."""
        parts = ("transformer", "text_encoder", "vae")
        encoder = self.config.text_encoder_device
        if encoder == "auto":
            encoder = device if fits(parts) else "cpu"
        self._text_encoder_device = encoder
        return {"transformer": device, "text_encoder": encoder, "vae": device}

    def load(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """Read every model from `model_dir` (local files only) onto `device`, UMT5 onto
        the device `place_weights` chose (`auto` without it: `device`)."""
        require_ftfy()  # before any weights: prompts are cleaned as Wan cleans them
        quiet_libraries()
        self.device, self.dtype = torch.device(device), dtype
        c = self.config
        encoder = self._text_encoder_device or c.text_encoder_device
        encoder_device = self.device if encoder == "auto" else torch.device(encoder)
        self.transformer = BlockTransformer(load_transformer(c, self.device, dtype))
        self.prompt_encoder = PromptEncoder.load(c.model_dir, c.text_len, encoder_device, dtype)
        self.decoder = StreamingDecoder(load_vae(c, self.device))

    @contextlib.contextmanager
    def bind_ar_diffusion_state(self, session_id: str,
                                state: ardiff.ARDiffusionKVState) -> Iterator[None]:
        """Marks a session whose forward may run (a batch enters every session's bind); the
        KV block itself is bound per forward, for the processors (`AttentionBinding`)."""
        self._bound_sessions.append(session_id)
        try:
            yield
        finally:
            self._bound_sessions.remove(session_id)

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
        return self.generate_blocks([request], OneRow(state))[0]

    @torch.inference_mode()
    def generate_blocks(self, requests: Sequence[ardiff.RolloutRequest],
                        states: ardiff.ARDiffusionKVStateBatch) -> list[ardiff.BlockOutput]:
        """The next block of every request's session. Per session, its prompts' K/V and (on
        a switch) its recache; then for all rows at once each step's probe forward of the
        first branch (and of `negative` over the rows that guide), one commit forward per
        branch, and the streaming decode (each session's own decoder cache; the sessions at
        one decode stage in one call). Every causal-Wan block has `frames_per_block` latent
        frames (only a first block's video is shorter), so any rows share a forward,
        wherever their sessions are."""
        requests = list(requests)
        states = as_rows(states, len(requests))  # raises unless one state per request
        self._check_ready(requests)
        branches = self._branches(requests)
        timesteps = self._timesteps(requests)
        rows = Rows(requests, states, [{b: self._text_kv(state, request, b) for b in branches}
                                       for state, request in zip(states, requests)])
        for row, request in enumerate(requests):  # a prompt switch's recache, per session
            if request.extra.get(RECACHE):
                for branch in branches:
                    recache_branch(self.transformer, states[row], branch, self.kept_latents,
                                   rows.text[row][branch], self.device, self.dtype)
        clean = self._denoise(rows, branches, timesteps)  # [B, C, F, h, w] float32
        self._commit(rows, branches, clean)
        sessions = [request.session_id for request in requests]
        frames = self.decoder.decode_rows(sessions, clean)
        return [ardiff.BlockOutput(frames=row_frames.cpu(),
                                   extra={"latents": clean if len(requests) == 1
                                          else clean[row:row + 1].clone()})
                for row, row_frames in enumerate(frames)]

    def _commit(self, rows: Rows, branches: tuple[str, ...], clean: torch.Tensor) -> None:
        """The clean blocks' K/V become history; their latents are kept while a recache may
        re-run their frames."""
        starts = []
        for branch in branches:
            with rows.states.block(branch, commit=True) as blk:
                starts.append(blk.start_frames)
                self.transformer.flow_rows(clean.to(self.device, self.dtype), 0.0, blk,
                                           rows.cross(branch))
        c = self.config
        for row, request in enumerate(rows.requests):
            at = {frames[row] for frames in starts}
            if len(at) != 1:  # a bug: the branches commit together, block for block
                raise KVStateError(f"causal-wan: session {request.session_id!r}: branches "
                                   f"{list(branches)} are at frames {sorted(at)}; they must "
                                   f"commit in step")
            self.kept_latents.record(request.session_id, at.pop(), clean[row:row + 1],
                                     c.sink_frames, c.window_frames)

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
    def _check_ready(self, requests: list[ardiff.RolloutRequest]) -> None:
        if self.transformer is None:
            raise KVStateError("causal-wan: generate_block before load(device, dtype); the "
                               "runner loads the pipeline first")
        for request in requests:
            if request.session_id not in self._bound_sessions:
                raise KVStateError(f"causal-wan: generate_block for session "
                                   f"{request.session_id!r} outside its "
                                   f"bind_ar_diffusion_state")

    def _branches(self, requests: list[ardiff.RolloutRequest]) -> tuple[str, ...]:
        for request in requests:
            if request.guidance_scale > 1.0 and not self.config.cfg:
                raise ConfigError(f"rollout.guidance_scale: {request.guidance_scale} needs the "
                                  f"negative branch; set pipeline.args.cfg: true (the "
                                  f"distilled Self-Forcing / CausVid / LongLive models run "
                                  f"without guidance)")
        # With CFG declared every block commits to both branches, guided or not, so their
        # histories (and positions) stay in step; an unguided block predicts with the first.
        return tuple(self.config.branch_names)

    def _timesteps(self, requests: list[ardiff.RolloutRequest]) -> list[float]:
        """The preset's steps, the same for every row (so are the rows' timesteps)."""
        timesteps = self.config.timesteps()
        for request in requests:
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

    def _denoise(self, rows: Rows, branches: tuple[str, ...],
                 timesteps: list[float]) -> torch.Tensor:
        """The rows' clean latents [B, C, F, h, w] (float32) after every denoising step."""
        table = self.config.preset.table
        x = self._noise_rows(rows.requests, 0)
        for step, timestep in enumerate(timesteps):
            flow = self._flow(rows, branches, x, timestep)
            clean = clean_from_flow(x, flow, table.sigma(timestep))
            if step + 1 < len(timesteps):
                noise = self._noise_rows(rows.requests, step + 1)
                x = renoise(clean, noise, table.sigma(timesteps[step + 1]))
        return clean

    def _noise_rows(self, requests: list[ardiff.RolloutRequest], step: int) -> torch.Tensor:
        """Each row's `noise(seed, block_index, step, ...)`, exactly as one session draws it,
        stacked: [B, C, F, h, w]."""
        draws = [self.noise(request.seed, request.block_index, step, self.config.latent_shape,
                            self.device, torch.float32) for request in requests]
        return draws[0] if len(draws) == 1 else torch.cat(draws)

    def _flow(self, rows: Rows, branches: tuple[str, ...], x: torch.Tensor,
              timestep: float) -> torch.Tensor:
        """Every row's flow at `timestep`: a probe of the first branch over every row and of
        `negative` over the rows with guidance_scale > 1, mixed there as
        v_neg + g (v_pos - v_neg) with each row's own g (rows of one g together)."""
        num_rows = len(rows.requests)
        with rows.states.block(branches[0], commit=False) as blk:  # probes: commit nothing
            positive = self.transformer.flow_rows(x.to(self.dtype), timestep, blk,
                                                  rows.cross(branches[0])).float()
        scales = [request.guidance_scale for request in rows.requests]
        guided = [row for row, scale in enumerate(scales) if scale > 1.0]
        if not guided:
            return positive
        with subset(rows.states, guided).block("negative", commit=False) as blk:
            negative = self.transformer.flow_rows(take(x, guided, num_rows).to(self.dtype),
                                                  timestep, blk,
                                                  rows.cross("negative", guided)).float()
        unguided = [row for row, scale in enumerate(scales) if scale <= 1.0]
        parts = {}
        if unguided:
            parts[None] = (unguided, take(positive, unguided, num_rows))
        for scale, members in group_rows([scales[row] for row in guided]).items():
            members_rows = [guided[member] for member in members]
            pos = take(positive, members_rows, num_rows)
            neg = take(negative, members, len(guided))
            parts[scale] = (members_rows, neg + scale * (pos - neg))
        return put(parts, num_rows)

    def _forget(self, session_id: str) -> None:
        if self.decoder is not None:
            self.decoder.forget(session_id)
        self.kept_latents.forget(session_id)
        for key in [k for k in self._prompts if k[0] == session_id]:
            del self._prompts[key]


@dataclass
class Rows:
    """One batched block's sessions: each row's request, state and prompt K/V per branch
    (per layer (k, v) [text_len, heads, hs])."""

    requests: list[ardiff.RolloutRequest]
    states: ardiff.ARDiffusionKVStateBatch
    text: list[dict[str, list[tuple[torch.Tensor, torch.Tensor]]]]

    def cross(self, branch: str, rows: Sequence[int] | None = None
              ) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
        """Per layer the prompt K/V of `rows` (default: all) on `branch`: (keys, values),
        one tensor per row (the sessions' own; the processors stack a layer's as it runs)."""
        chosen = range(len(self.requests)) if rows is None else rows
        per_row = [self.text[row][branch] for row in chosen]
        return [([pairs[layer][0] for pairs in per_row], [pairs[layer][1] for pairs in per_row])
                for layer in range(len(per_row[0]))]

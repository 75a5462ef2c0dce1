"""`MatrixGame`: Matrix-Game 2.0 (SkyworkAI), an image-to-world model steered by keyboard and
mouse, from the released files. One block of 3 latent frames for each of B sessions:

    first block of a session: its image (request.extra["image"]) -> CLIP tokens -> the
        "image" cross-attention K/V; VAE-encoded image latents (conditioning.py)
    its actions -> per video frame (track.py) -> each latent frame's action window
    x = noise(step 0)
    for each step k at timestep t_k:            probes: attend to history, commit nothing
        v  = transformer([x | mask | image latents], t_k, actions)
        x0 = x - sigma(t_k) v                   (float64)
        x  = (1 - sigma(t_k+1)) x0 + sigma(t_k+1) noise(step k+1)   unless k is the last
    transformer([x0 | ...], t = 0), commit=True  the K/V (and the action K/V) kept
    frames = streaming VAE decode of x0         (1 + 4 (F - 1) frames first, then 4 F)

The main self-attention goes through ardiff's KV state (causal-Wan's processors); the action
modules' caches are per-session state the pipeline keeps (counted in the spec), dropped on
reset and close. The sampler, the noise hook and the decoder are causal-Wan's.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

import ardiff
from ardiff.dtypes import torch_dtype
from ardiff.errors import ConfigError, KVStateError
from ardiff.image import IMAGE_KEY, open_image
from ardiff.pipelines.causal_wan.decode import StreamingDecoder
from ardiff.pipelines.causal_wan.models import quiet_libraries, wan_vae
from ardiff.pipelines.causal_wan.pipeline import CausalWan
from ardiff.pipelines.causal_wan.schedule import clean_from_flow, renoise
from ardiff.pipelines.matrix_game.action_module import keep_last
from ardiff.pipelines.matrix_game.conditioning import (
    ImageCondition,
    encode_image_latents,
    image_pixels,
)
from ardiff.pipelines.matrix_game.config import CLIP_FILE, FRAMES_PER_BLOCK, build_config
from ardiff.pipelines.matrix_game.models import load_clip, load_transformer
from ardiff.pipelines.matrix_game.sessions import SessionState
from ardiff.pipelines.matrix_game.spec import BRANCH, IMAGE_CACHE, build_spec
from ardiff.pipelines.matrix_game.transformer import MatrixGameTransformer, RowActions
from ardiff.pipelines.matrix_game.weight_sizes import weight_bytes
from ardiff.pipelines.shared.rows import OneRow, as_rows

WARMUP_GRAY = 128  # the warmup's image: one gray level


class MatrixGame(ardiff.ARDiffusionPipelineBase):
    """Matrix-Game 2.0 (universal, gta_drive or templerun). Construction reads the
    checkpoint's config.json and the VAE's shapes; `load` reads the weights."""

    ardiff_inputs = ardiff.PipelineInputs(prompt="ignored", image="required",
                                          actions="accepted")
    noise = CausalWan.noise  # the same seeded stream per (seed, block, step)

    def __init__(self, **args: Any) -> None:
        self.config = build_config(**args)
        self.action_names = self.config.space.names
        self.play_keys = self.config.space.play_keys  # W A S D, the camera on I J K L / arrows
        self.video_frames_per_latent_frame = self.config.vae.temporal_factor
        self.video_frames_first_latent_frame = 1
        self.transformer: MatrixGameTransformer | None = None
        self.decoder: StreamingDecoder | None = None
        self.vae: Any = None
        self.clip: Any = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.sessions: dict[str, SessionState] = {}
        self._bound: list[str] = []

    # -- contract ------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return build_spec(self.config)

    def weight_bytes(self, dtype: str) -> dict[str, int]:
        return weight_bytes(self.config, dtype)

    def ar_diffusion_input_paths(self) -> dict[str, Path | None]:
        c = self.config
        return {"pipeline.args.model_dir": c.model_dir, "pipeline.args.checkpoint": c.checkpoint}

    def load(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """The transformer and CLIP in `dtype`, the VAE in `vae_dtype`, on `device`."""
        quiet_libraries()
        self.device, self.dtype = torch.device(device), dtype
        c = self.config
        config = json.loads(c.model_config.read_text())
        self.transformer = load_transformer(c, config, self.device, dtype)
        self.clip = load_clip(c, self.device, dtype)
        self.vae = wan_vae(c.model_dir, torch_dtype(c.vae_dtype)).to(self.device).eval()
        self.decoder = StreamingDecoder(self.vae)

    @contextlib.contextmanager
    def bind_ar_diffusion_state(self, session_id: str,
                                state: ardiff.ARDiffusionKVState) -> Iterator[None]:
        self._bound.append(session_id)
        try:
            yield
        finally:
            self._bound.remove(session_id)

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._forget(session_id)

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Blocks to fill the window and evict once, from a gray image, idle."""
        from PIL import Image

        spec = self.ar_diffusion_kv_cache_spec()
        blocks = -(-spec.window_frames // spec.frames_per_block) + 1
        gray = Image.new("RGB", (self.config.width, self.config.height), (WARMUP_GRAY,) * 3)
        return [ardiff.RolloutRequest(session_id, block_index=i, reset=i == 0,
                                      extra={IMAGE_KEY: gray} if i == 0 else {})
                for i in range(blocks)]

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        return self.generate_blocks([request], OneRow(state))[0]

    @torch.inference_mode()
    def generate_blocks(self, requests: Sequence[ardiff.RolloutRequest],
                        states: ardiff.ARDiffusionKVStateBatch) -> list[ardiff.BlockOutput]:
        """The next block of every request's session, the rows in one forward per step."""
        requests = list(requests)
        states = as_rows(states, len(requests))
        self._check_ready(requests)
        starts = [state.num_committed_frames(BRANCH) for state in states]
        rows = [self._session(request, state, start)
                for request, state, start in zip(requests, states, starts)]
        cond = torch.cat([row.image.block(start, FRAMES_PER_BLOCK)
                          for row, start in zip(rows, starts)]).to(self.device, self.dtype)
        cross = [([kv[layer][0] for kv in self._image_kv(states)],
                  [kv[layer][1] for kv in self._image_kv(states)])
                 for layer in range(self.config.model.num_layers)]
        actions = self._actions(rows, starts)
        clean = self._denoise(requests, states, starts, cond, cross, actions)
        with states.block(BRANCH, commit=True) as blk:
            self._check_window(blk, starts)
            _, new = self.transformer.flow_actions(
                torch.cat([clean.to(self.device, self.dtype), cond], dim=1), 0.0, blk, cross,
                actions)
        kept = self.config.window_frames - FRAMES_PER_BLOCK
        for index, row in enumerate(rows):
            row.kept = {layer: keep_last(row.kept.get(layer), per_row[index], kept)
                        for layer, per_row in new.items()}
        frames = self.decoder.decode_rows([r.session_id for r in requests], clean)
        return [ardiff.BlockOutput(frames=f.cpu(), extra={"latents": clean[i:i + 1].clone()})
                for i, f in enumerate(frames)]

    # -- steps -----------------------------------------------------------------------
    def _denoise(self, requests, states, starts, cond, cross, actions) -> torch.Tensor:
        """The rows' clean latents [B, 16, F, h, w] (float32) after every step."""
        c = self.config
        table, timesteps = c.preset.table, c.timesteps()
        shape = (1, c.model.out_dim, FRAMES_PER_BLOCK, c.latent_height, c.latent_width)
        x = torch.cat([self.noise(r.seed, r.block_index, 0, shape, self.device, torch.float32)
                       for r in requests])
        for step, timestep in enumerate(timesteps):
            with states.block(BRANCH, commit=False) as blk:
                self._check_window(blk, starts)
                flow, _ = self.transformer.flow_actions(
                    torch.cat([x.to(self.dtype), cond], dim=1), timestep, blk, cross, actions)
            clean = clean_from_flow(x, flow.float(), table.sigma(timestep))
            if step + 1 == len(timesteps):
                return clean
            sigma = table.sigma(timesteps[step + 1])
            x = torch.cat([renoise(clean[i:i + 1], self.noise(r.seed, r.block_index, step + 1,
                                                                shape, self.device,
                                                                torch.float32), sigma)
                           for i, r in enumerate(requests)])
        raise AssertionError("no denoising steps")  # the presets have at least one

    def _session(self, request: ardiff.RolloutRequest, state: Any, start: int) -> SessionState:
        """The request's session state: started from its image at frame 0; its actions
        written for this block."""
        session = self.sessions.get(request.session_id)
        if session is None or start == 0:
            image = request.extra.get(IMAGE_KEY)
            if image is None:
                raise ConfigError(f"matrix-game: session {request.session_id!r} starts without "
                                  f"an image; give one (rollout.image, --image, or the serve "
                                  f"session's image)")
            session = SessionState(request.session_id, self._condition(image))
            self.sessions[request.session_id] = session
            state.clear_cross_kv(BRANCH)
        if state.cross_kv(BRANCH, IMAGE_CACHE) is None:
            state.set_cross_kv(BRANCH, IMAGE_CACHE,
                               self.transformer.image_kv(session.image.clip_tokens))
        session.track.write(self.config.space, start, FRAMES_PER_BLOCK, request.actions)
        return session

    def _condition(self, image: Any) -> ImageCondition:
        c = self.config
        pixels = image_pixels(open_image(image, "rollout.image"), c.height, c.width)
        tokens = self.clip(pixels[:, :, 0].to(self.device, self.dtype))
        return ImageCondition(tokens, encode_image_latents(self.vae, pixels))

    def _image_kv(self, states: Any) -> list[Any]:
        return [state.cross_kv(BRANCH, IMAGE_CACHE) for state in states]

    def _actions(self, rows: list[SessionState], starts: list[int]) -> RowActions:
        window = self.config.model.action["windows_size"]
        pairs = [row.track.windows(start, FRAMES_PER_BLOCK, window)
                 for row, start in zip(rows, starts)]
        keyboard = torch.stack([k for k, _ in pairs]).to(self.device, self.dtype)
        mouse = torch.stack([m for _, m in pairs]).to(self.device, self.dtype) \
            if self.config.space.has_mouse else None
        layers = list(self.transformer.actions)
        return RowActions(mouse, keyboard, {layer: [row.kept.get(layer) for row in rows]
                                            for layer in layers})

    def _check_window(self, blk: Any, starts: list[int]) -> None:
        """The runtime's window must be the checkpoint's: the action caches keep that one."""
        kept = self.config.window_frames - FRAMES_PER_BLOCK
        for start, visible in zip(starts, blk.visible_frames):
            if list(visible) != list(range(max(0, start - kept), start)):
                raise ConfigError(f"runtime.kv: matrix-game attends to the last "
                                  f"{self.config.window_frames} frames (its checkpoint's "
                                  f"local_attn_size) and no sink; leave runtime.kv.window_frames"
                                  f" and sink_frames unset")

    def _check_ready(self, requests: list[ardiff.RolloutRequest]) -> None:
        if self.transformer is None:
            raise KVStateError("matrix-game: generate_block before load(device, dtype); the "
                               "runner loads the pipeline first")
        for request in requests:
            if request.session_id not in self._bound:
                raise KVStateError(f"matrix-game: generate_block for session "
                                   f"{request.session_id!r} outside its bind_ar_diffusion_state")

    def _forget(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        if self.decoder is not None:
            self.decoder.forget(session_id)


__all__ = ["MatrixGame", "CLIP_FILE"]

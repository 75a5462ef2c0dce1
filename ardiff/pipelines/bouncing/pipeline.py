"""The bouncing world model as an ardiff pipeline: one `main` branch, one frame per block.

    blocks: `context_frames` start frames rendered by the simulator (seeded by
            request.seed, moved by the actions) are committed as clean history (a sink
            frame without the sprite: the balls' looks to keep); then each frame is sampled
            in `num_steps` flow-matching steps (probes) and committed at t = 0 (noised to
            `context_noise` with seeded noise when that is set)
    video:  the 32 x 32 model frames, upscaled nearest-neighbour `upscale` times (1: not;
            `output.scale` then lets the video writer do it on its own thread)
    batch:  `generate_blocks` makes one frame of each of B sessions (each at its own
            position, start frames and sampled frames side by side) in one forward per
            step; `generate_block` is the batch of one (`shared/rows.py`)

The network is `model.py`, its weights `checkpoint.py` (shipped in `weights/`, made by
`python -m ardiff.pipelines.bouncing.train`); nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

import ardiff
from ardiff.contract.base import warmup_blocks
from ardiff.dtypes import torch_dtype
from ardiff.pipelines.bouncing import sim
from ardiff.pipelines.bouncing.checkpoint import load_weights
from ardiff.pipelines.bouncing.config import RGB_CHANNELS, BouncingConfig
from ardiff.pipelines.bouncing.model import BouncingDiT, Conditioning, FrameInputs, pixels_to_model
from ardiff.pipelines.shared.nn import parameter_bytes
from ardiff.pipelines.shared.rows import OneRow, as_rows, group_rows, put, subset
from ardiff.pipelines.shared.sampling import rows_noise, sample

if TYPE_CHECKING:  # pragma: no cover - typing only: the loop imports this module
    from ardiff.pipelines.bouncing.reference import ReferenceLoop

BRANCH = "main"
FRAMES_PER_BLOCK = 1   # an action takes effect in the very next frame
CLEAN = 0.0            # the noise level of a committed frame


def history_seed(seed: int) -> int:
    """The noise stream of a committed frame's `context_noise` (negative: never a sampling
    stream's, which are the seeds themselves)."""
    return -1 - seed


def to_video(x: torch.Tensor, upscale: int) -> torch.Tensor:
    """Frames [F, 3, size, size] in [-1, 1] -> uint8 [F, size*up, size*up, 3], nearest-neighbour."""
    rgb = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
    if upscale > 1:  # 1: the video writer may upscale instead (output.scale), off this thread
        rgb = rgb.repeat_interleave(upscale, dim=1).repeat_interleave(upscale, dim=2)
    return rgb.contiguous()


class BouncingWorld(ardiff.ARDiffusionPipelineBase):
    """The pipeline: one `main` branch, one frame per block, actions as register tokens.

    Per-session model-owned state: the simulator world while it renders the start
    frames (dropped once the model takes over).
    """

    action_names = sim.ACTIONS  # what `rollout.actions` and `ardiff play` may choose
    ardiff_inputs = ardiff.PipelineInputs(prompt="ignored", actions="accepted")

    def __init__(self, **config) -> None:
        self.config = BouncingConfig(**config)
        self.model: BouncingDiT | None = None
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self._worlds: dict[str, sim.SimState] = {}
        self._levels: dict[tuple[float, float], Conditioning] = {}  # (t, level) -> conditioning
        self._compiler = None                          # set by compile_layers

    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        c = self.config
        return ardiff.ARDiffusionKVCacheSpec(
            num_layers=c.num_layers, num_kv_heads=c.num_heads, head_size=c.head_size,
            tokens_per_frame=c.tokens_per_frame, frames_per_block=FRAMES_PER_BLOCK,
            window_frames=c.window_frames, sink_frames=c.sink_frames,
            session_capacity=c.session_capacity, max_model_len=c.max_frames,
            kv_branches=(ardiff.ARDiffusionKVBranchSpec(BRANCH, 0),),
            max_scratch_tokens_per_branch=c.registers_per_action,
            model_owned_state_bytes_per_session=sim.STATE_BYTES)

    def weight_bytes(self, dtype: str) -> dict[str, int]:
        """The model's parameters in the run's dtype (counted, not read: `load` reads them)."""
        return {"model": parameter_bytes(lambda: BouncingDiT(self.config), torch_dtype(dtype))}

    def load(self, device, dtype: torch.dtype) -> None:
        self.device, self.dtype = torch.device(device), dtype
        if self.device.type == "cpu" and self.config.cpu_threads:
            torch.set_num_threads(self.config.cpu_threads)
        self.model = load_weights(self.config).to(self.device, dtype).eval()
        self._levels.clear()
        if self._compiler is not None:
            self.model.block_layers = self._compiler(BouncingDiT.block_layers.__get__(self.model))

    def compile_layers(self, compiler) -> None:
        """Compile the layer stack (`BouncingDiT.block_layers`) with `compiler`, e.g.
        `torch.compile`; each self-attention in it stays one `ardiff::paged_attend` call."""
        self._compiler = compiler
        if self.model is not None:
            self.model.block_layers = compiler(BouncingDiT.block_layers.__get__(self.model))

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self._worlds.pop(session_id, None)

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self._worlds.pop(session_id, None)

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        """Start frames, then enough sampled frames to fill sink and window and evict once;
        the actions cycle through every action."""
        blocks = self.config.context_frames + warmup_blocks(self.ar_diffusion_kv_cache_spec())
        return [ardiff.RolloutRequest(session_id, block_index=i,
                                      actions=(sim.ACTIONS[i % len(sim.ACTIONS)],), reset=i == 0)
                for i in range(blocks)]

    def action_index(self, actions: tuple[str, ...] | None) -> int:
        """The block's one action (a block is one frame); None means `none`."""
        names = tuple(actions or ("none",))
        if len(names) != 1 or names[0] not in sim.ACTIONS:
            raise ardiff.ConfigError(f"rollout.actions: {list(names)!r} is not one action for "
                                     f"this one-frame block; use one of "
                                     f"{', '.join(sim.ACTIONS)}")
        return sim.ACTIONS.index(names[0])

    def reference_loop(self, spec: ardiff.ARDiffusionKVCacheSpec) -> ReferenceLoop:
        """`ardiff bench`'s reference arm: a fresh hand-written loop over these weights with
        `spec`'s window and sink (`reference.py`)."""
        from ardiff.pipelines.bouncing.reference import ReferenceLoop  # it imports this module

        window = {"window_frames": spec.window_frames, "sink_frames": spec.sink_frames}
        return ReferenceLoop(self.model, dataclasses.replace(self.config, **window))

    @torch.inference_mode()
    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        return self.generate_blocks([request], OneRow(state))[0]

    @torch.inference_mode()
    def generate_blocks(self, requests: Sequence[ardiff.RolloutRequest],
                        states: ardiff.ARDiffusionKVStateBatch) -> list[ardiff.BlockOutput]:
        """The next frame of every request's session in one forward per step: start-frame
        rows come from their simulators, the others sample (rows with the same step count
        together), then every row commits its clean frame at once."""
        if self.model is None:
            self.load("cpu", torch.float32)
        states = as_rows(states, len(requests))
        frames = [state.num_committed_frames(BRANCH) for state in states]
        actions = [self.action_index(request.actions) for request in requests]
        inputs = self.model.block_inputs(torch.tensor(actions, device=self.device), frames)
        kinds = [self._row_kind(request, frame) for request, frame in zip(requests, frames)]
        parts, sinks = {}, {}
        for key, rows in group_rows(kinds).items():
            if key is None:
                shown, kept = zip(*(self._start_frame(requests[row], frames[row], actions[row])
                                    for row in rows))
                x = torch.stack(shown)
                sinks[key] = (rows, torch.stack(kept))
            else:
                x = self._sample([requests[row] for row in rows], subset(states, rows),
                                 [frames[row] for row in rows], inputs.rows(rows), key)
                sinks[key] = (rows, x)
            parts[key] = (rows, x)
        x = put(parts, len(requests))                  # [B, 1, 3, s, s]: the video
        committed = put(sinks, len(requests)) if any(f < self.config.sink_frames
                                                     for f in frames) else x
        committed = self._history(committed, requests, frames)
        with states.block(BRANCH, commit=True) as blk:  # the clean frames become history
            self.model.forward_blocks(committed, self._conditioning(CLEAN, self.config.context_noise),
                                      inputs, blk)
        video = to_video(x.flatten(0, 1), self.config.upscale).unflatten(0, x.shape[:2])
        return [ardiff.BlockOutput(frames=frames) for frames in video]

    def _row_kind(self, request: ardiff.RolloutRequest, frame: int) -> int | None:
        """None for a simulator start frame, else the row's number of sampling steps."""
        if frame < self.config.context_frames:
            return None
        return request.num_steps or self.config.num_steps

    def _conditioning(self, t: float, level: float = 0.0) -> Conditioning:
        """The model's conditioning for noise level t (and context noise `level`, which a
        model without that input ignores), computed once per pair."""
        if (t, level) not in self._levels:
            t_level = [torch.full((1, 1), v, device=self.device) for v in (t, level)]
            self._levels[t, level] = self.model.conditioning(*t_level)
        return self._levels[t, level]

    def _history(self, x: torch.Tensor, requests, frames: list[int]) -> torch.Tensor:
        """The frames x [B, 1, 3, s, s] as committed: noised to `context_noise` with each
        row's seeded noise (`history_seed`), or as they are when it is 0."""
        level = self.config.context_noise
        if not level:
            return x
        noise = rows_noise(tuple(x.shape[1:]), [history_seed(r.seed) for r in requests],
                           frames, self.device, self.dtype)
        return (1 - level) * x + level * noise

    def _start_frame(self, request, frame: int, action: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame `frame` of the simulator world named by the seed, moved by `action`: as
        shown, and as committed (a sink frame holds the balls alone; see the README)."""
        sid = request.session_id
        if frame == 0:
            self._worlds[sid] = sim.SimState.from_seed(request.seed)
        elif sid not in self._worlds:
            raise ardiff.PipelineError(f"session {sid!r}: no simulator world for start frame "
                                       f"{frame}; the session must start at frame 0")
        world = sim.step(self._worlds[sid], np.array([action]))
        if frame + 1 < self.config.context_frames:
            self._worlds[sid] = world
        else:
            del self._worlds[sid]
        shown = pixels_to_model(sim.render(world)).to(self.device, self.dtype)  # [1, 3, s, s]
        if frame >= self.config.sink_frames:
            return shown, shown
        return shown, pixels_to_model(sim.render(world, sprite=False)).to(self.device, self.dtype)

    def _sample(self, requests, states, frames: list[int], inputs: FrameInputs,
                num_steps: int) -> torch.Tensor:
        """num_steps flow-matching steps from each row's seeded noise, each step one probe
        of every row: [B, 1, 3, s, s]."""
        c = self.config
        shape = (FRAMES_PER_BLOCK, RGB_CHANNELS, c.size, c.size)
        noise = rows_noise(shape, [r.seed for r in requests], frames, self.device, self.dtype)

        def predict_clean(x: torch.Tensor, t: float) -> torch.Tensor:
            with states.block(BRANCH) as blk:  # a probe: attends to history, commits nothing
                clean = self.model.forward_blocks(x, self._conditioning(t), inputs, blk)
            return clean.clamp(-1, 1)           # the model's pixel range

        return sample(noise, predict_clean, num_steps)

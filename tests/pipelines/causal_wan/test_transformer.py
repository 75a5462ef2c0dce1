"""The proof: block by block through ardiff's paged cache equals diffusers' stock
`WanTransformer3DModel` forward over the whole prefix, with a block-causal (windowed)
mask and per-token timesteps."""

from __future__ import annotations

import copy

import torch
from extras import require_extra

require_extra("wan")
from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402
from wan_reference import MaskedAttention  # noqa: E402

TOLERANCE = 1e-5  # relative, float32
PROMPT = "a cat walks on the beach"



def visible_frames(block: int, frames_per_block: int, window: int, sink: int) -> list[int]:
    """docs/design.md#3-what-a-block-sees in its own words: the first `sink` frames, the most recent window - B
    committed non-sink frames, and the block itself."""
    start = block * frames_per_block
    past = max(0, window - frames_per_block)
    non_sink = list(range(sink, start))
    recent = non_sink[len(non_sink) - past:] if past else []
    return list(range(min(sink, start))) + recent + list(range(start, start + frames_per_block))


def block_causal_mask(blocks: int, frames_per_block: int, window: int, sink: int,
                      tokens_per_frame: int) -> torch.Tensor:
    frames = blocks * frames_per_block
    visible = torch.zeros(frames, frames, dtype=torch.bool)
    for block in range(blocks):
        rows = slice(block * frames_per_block, (block + 1) * frames_per_block)
        visible[rows, visible_frames(block, frames_per_block, window, sink)] = True
    return visible.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


class StockReference:
    """The stock model (a copy of the pipeline's, with diffusers' processors) over prefixes."""

    def __init__(self, pipeline) -> None:
        self.model = copy.deepcopy(pipeline.transformer.model)
        self.spec = pipeline.ar_diffusion_kv_cache_spec()
        self.prompt_embeds = pipeline.prompt_encoder.encode(PROMPT)

    def flow(self, latents: torch.Tensor, frame_timesteps: list[float]) -> torch.Tensor:
        """The stock forward over [1, C, T, h, w] with one timestep per frame."""
        s = self.spec
        blocks = latents.shape[2] // s.frames_per_block
        mask = block_causal_mask(blocks, s.frames_per_block, s.window_frames, s.sink_frames,
                                 s.tokens_per_frame)
        processors = {}
        for name in self.model.attn_processors:
            processors[name] = MaskedAttention(mask) if ".attn1." in name else WanAttnProcessor()
        self.model.set_attn_processor(processors)
        per_token = torch.tensor(frame_timesteps).repeat_interleave(s.tokens_per_frame)[None]
        with torch.inference_mode():
            return self.model(latents, per_token, self.prompt_embeds, return_dict=False)[0]

    def rollout(self, pipeline, blocks: int, seed: int) -> list[torch.Tensor]:
        """The sampler of the issue, written out: each step a stock forward of the prefix."""
        table, timesteps = pipeline.config.preset.table, pipeline.config.timesteps()
        shape, frames = pipeline.config.latent_shape, self.spec.frames_per_block
        history: list[torch.Tensor] = []
        for block in range(blocks):
            x = pipeline.noise(seed, block, 0, shape, torch.device("cpu"), torch.float32)
            for step, t in enumerate(timesteps):
                prefix = torch.cat([*history, x], dim=2)
                flow = self.flow(prefix, [0.0] * (block * frames) + [t] * frames)[:, :, -frames:]
                clean = (x.double() - table.sigma(t) * flow.double()).float()
                if step + 1 < len(timesteps):
                    sigma = table.sigma(timesteps[step + 1])
                    noise = pipeline.noise(seed, block, step + 1, shape, torch.device("cpu"),
                                           torch.float32)
                    x = (1 - sigma) * clean + sigma * noise
            history.append(clean)
        return history


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


def test_block_by_block_rollout_equals_the_stock_forward_over_the_prefix(tiny_pipeline,
                                                                          run_blocks):
    blocks = 4  # window 6 / sink 3 / 3 frames per block: block 3 no longer sees block 1
    outputs = run_blocks(tiny_pipeline, blocks, prompt=PROMPT, seed=5)
    expected = StockReference(tiny_pipeline).rollout(tiny_pipeline, blocks, seed=5)
    errors = [relative_error(out.extra["latents"], ref) for out, ref in zip(outputs, expected)]
    assert max(errors) <= TOLERANCE, errors


def test_one_probe_equals_the_stock_forward_at_a_noisy_timestep(tiny_pipeline):
    """A probe of block 2 at t = 700 over two committed blocks, per-token timesteps."""
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan
    from ardiff.kv.state import open_state

    spec = tiny_pipeline.ar_diffusion_kv_cache_spec()
    cache = create_cache(make_plan(spec, "float32", 4, 1 << 30), "paged", "cpu", poison=True)
    state = open_state(cache, "probe")
    reference = StockReference(tiny_pipeline)
    model = tiny_pipeline.transformer
    cross = model.text_kv(reference.prompt_embeds)
    latents = torch.randn((1, 16, 9, 6, 8), generator=torch.Generator().manual_seed(0))
    for block in range(2):
        with state.block("main", commit=True) as blk:
            model.flow(latents[:, :, 3 * block:3 * block + 3], 0.0, blk, cross)
    with state.block("main") as blk:
        ours = model.flow(latents[:, :, 6:], 700.0, blk, cross)
    expected = reference.flow(latents, [0.0] * 6 + [700.0] * 3)[:, :, 6:]
    assert relative_error(ours, expected) <= TOLERANCE


def test_paged_equals_the_dense_backend_exactly(tiny_pipeline, run_blocks):
    paged = run_blocks(tiny_pipeline, 4, prompt=PROMPT, seed=2)
    dense = run_blocks(tiny_pipeline, 4, backend="dense", prompt=PROMPT, seed=2)
    for a, b in zip(paged, dense):
        assert torch.equal(a.extra["latents"], b.extra["latents"])
        assert torch.equal(a.frames, b.frames)

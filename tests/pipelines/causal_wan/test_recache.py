"""LongLive's prompt switch with KV recache equals recomputing the kept frames from scratch
under the new prompt: diffusers' stock forward over the clean latents with the recache's
visibility as a block mask."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
import diffusers.models.transformers.transformer_wan as transformer_wan  # noqa: E402
from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402
from wan_reference import MaskedAttention  # noqa: E402

from ardiff import RolloutRequest  # noqa: E402
from ardiff.engine.runner import Runner  # noqa: E402
from ardiff.kv.backend import create_cache  # noqa: E402
from ardiff.kv.plan import make_plan  # noqa: E402
from ardiff.kv.state import open_state  # noqa: E402
from ardiff.pipelines.causal_wan import CausalWan  # noqa: E402
from ardiff.pipelines.causal_wan.recache import (  # noqa: E402
    KeptLatents,
    frame_runs,
    kept_latents_bytes,
    recache_branch,
)

TOLERANCE = 1e-5  # relative, float32
OLD, NEW = "a cat walks on the beach", "a dog swims in a lake"
TINY_CONFIG = Path(__file__).parents[3] / "configs" / "causal-wan-tiny.yaml"


@pytest.fixture(scope="module")
def longlive_like(tiny_args):
    """The tiny model with LongLive's window: sink 3, window 9 (keeps 3 + 6 frames)."""
    pipeline = CausalWan(**{**tiny_args, "window_frames": 9})
    pipeline.load("cpu", torch.float32)
    return pipeline



def recache_mask(num_frames: int, kept: list[int], runs: list[tuple[int, int]],
                 extra_rows: dict[int, list[int]], tokens_per_frame: int) -> torch.Tensor:
    """Frame visibility in its own words: a recached run sees the kept frames before it and
    itself; `extra_rows` name what other frames see; any other frame sees only itself."""
    visible = torch.eye(num_frames, dtype=torch.bool)
    for start, count in runs:
        rows = list(range(start, start + count))
        for row in rows:
            visible[row, [f for f in kept if f < start] + rows] = True
    for row, cols in extra_rows.items():
        visible[row] = False
        visible[row, cols] = True
    return visible.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


class StockReference:
    """The stock model (a copy, diffusers' processors) over all frames at once, recording the
    self-attention K/V it attends with (post-RoPE, per layer)."""

    def __init__(self, pipeline, prompt: str) -> None:
        self.model = copy.deepcopy(pipeline.transformer.model)
        self.embeds = pipeline.prompt_encoder.encode(prompt)
        self.tokens_per_frame = pipeline.ar_diffusion_kv_cache_spec().tokens_per_frame

    def forward(self, latents, timesteps, mask) -> tuple[torch.Tensor, list]:
        processors = {name: MaskedAttention(mask) if ".attn1." in name else WanAttnProcessor()
                      for name in self.model.attn_processors}
        self.model.set_attn_processor(processors)
        recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
        stock = transformer_wan.dispatch_attention_fn

        def recording(query, key, value, attn_mask=None, **kwargs):
            if attn_mask is mask:  # self-attention: [1, tokens, heads, head_size]
                recorded.append((key[0], value[0]))
            return stock(query, key, value, attn_mask=attn_mask, **kwargs)

        per_token = torch.tensor(timesteps).repeat_interleave(self.tokens_per_frame)[None]
        transformer_wan.dispatch_attention_fn = recording
        try:
            with torch.inference_mode():
                out = self.model(latents, per_token, self.embeds, return_dict=False)[0]
        finally:
            transformer_wan.dispatch_attention_fn = stock
        return out, recorded


def cached_kv(cache, session_id: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    kv = cache._sessions[session_id].branches["main"]
    if cache.backend_name == "dense":
        return kv.k[layer], kv.v[layer]
    return cache.storage.read(layer, cache.storage.frames_address(kv.table.visible_pages))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


def test_frame_runs_cut_at_gaps_and_every_block():
    assert frame_runs([0, 1, 2, 9, 10, 11, 12, 13, 14], 3) == [(0, 3), (9, 3), (12, 3)]
    assert frame_runs([0, 1, 5, 6, 7, 8], 2) == [(0, 2), (5, 2), (7, 2)]
    assert frame_runs([4, 5, 6], 2) == [(4, 2), (6, 1)]
    assert frame_runs([], 3) == []


def test_recached_kv_equal_the_stock_forward_under_the_new_prompt(longlive_like):
    """15 clean frames committed under OLD; recache under NEW; the K/V held (sink 0..2 and
    frames 9..14) equal the stock model's over those latents with the recache's mask."""
    pipeline, blocks = longlive_like, 5
    spec = pipeline.ar_diffusion_kv_cache_spec()
    latents = torch.randn((1, 16, 3 * blocks, 6, 8), generator=torch.Generator().manual_seed(1))
    model = pipeline.transformer
    old_cross = model.text_kv(pipeline.prompt_encoder.encode(OLD))
    new_cross = model.text_kv(pipeline.prompt_encoder.encode(NEW))
    held = {}
    for backend in ("paged", "dense"):
        cache = create_cache(make_plan(spec, "float32", 4, 1 << 30), backend, "cpu", poison=True)
        state, kept = open_state(cache, "s"), KeptLatents()
        for block in range(blocks):
            x = latents[:, :, 3 * block:3 * block + 3]
            with state.block("main", commit=True) as blk:
                model.flow(x, 0.0, blk, old_cross)
            kept.record("s", 3 * block, x, state.kept_frames("main"))
        assert state.kept_frames("main") == [0, 1, 2, 9, 10, 11, 12, 13, 14]
        used = cache.stats().pages_in_use
        recache_branch(model, state, "main", kept, new_cross, torch.device("cpu"), torch.float32)
        assert state.num_committed_frames("main") == 15 and cache.stats().pages_in_use == used
        held[backend] = [cached_kv(cache, "s", layer) for layer in range(spec.num_layers)]
        state.close()
    kept_frames = [0, 1, 2, 9, 10, 11, 12, 13, 14]
    mask = recache_mask(15, kept_frames, frame_runs(kept_frames, 3), {}, spec.tokens_per_frame)
    _, stock = StockReference(pipeline, NEW).forward(latents, [0.0] * 15, mask)
    rows = torch.cat([torch.arange(f * 12, f * 12 + 12) for f in kept_frames])
    errors = []
    for layer, (paged, dense) in enumerate(zip(held["paged"], held["dense"])):
        for ours, theirs, stock_kv in zip(paged, dense, stock[layer]):
            assert torch.equal(ours, theirs)  # paged = dense, bit for bit
            errors.append(relative_error(ours, stock_kv[rows]))
    assert max(errors) <= TOLERANCE, errors


def test_the_block_after_a_recache_equals_the_stock_sampler(longlive_like):
    """Runner level: 5 blocks under OLD, then block 5 under NEW with `on_switch: recache`
    (clear_cross_kv + extra recache): its latents equal each step of the stock forward over
    [the 15 clean frames | x] where frame rows see what the recache and block 5 see."""
    pipeline, seed = longlive_like, 4
    spec = pipeline.ar_diffusion_kv_cache_spec()
    plan = make_plan(spec, "float32", 4, 1 << 30)
    outputs = {}
    for backend in ("paged", "dense"):
        runner = Runner(pipeline, create_cache(plan, backend, "cpu", poison=True), "cpu")
        with contextlib.closing(runner):
            outputs[backend] = [runner.execute(RolloutRequest(
                "s", block_index=i, prompt=OLD if i < 5 else NEW, seed=seed,
                clear_cross_kv=i == 5, extra={"recache": True} if i == 5 else {})).output
                for i in range(6)]
            assert pipeline.kept_latents.nbytes("s") == kept_latents_bytes(pipeline.config)
    for a, b in zip(*outputs.values()):
        assert torch.equal(a.extra["latents"], b.extra["latents"])
    history = torch.cat([o.extra["latents"] for o in outputs["paged"][:5]], dim=2)
    kept = [0, 1, 2, 9, 10, 11, 12, 13, 14]
    mask = recache_mask(18, kept, frame_runs(kept, 3),
                        {row: kept + [15, 16, 17] for row in (15, 16, 17)}, 12)
    reference = StockReference(pipeline, NEW)
    table, timesteps = pipeline.config.preset.table, pipeline.config.timesteps()
    shape, cpu = pipeline.config.latent_shape, torch.device("cpu")
    x = pipeline.noise(seed, 5, 0, shape, cpu, torch.float32)
    for step, t in enumerate(timesteps):
        flow, _ = reference.forward(torch.cat([history, x], dim=2), [0.0] * 15 + [t] * 3, mask)
        clean = (x.double() - table.sigma(t) * flow[:, :, 15:].double()).float()
        if step + 1 < len(timesteps):
            sigma = table.sigma(timesteps[step + 1])
            x = (1 - sigma) * clean + sigma * pipeline.noise(seed, 5, step + 1, shape, cpu,
                                                             torch.float32)
    assert relative_error(outputs["paged"][5].extra["latents"], clean) <= TOLERANCE


def test_a_recache_on_a_fresh_session_is_a_plain_block(tiny_pipeline, run_blocks):
    plain = run_blocks(tiny_pipeline, 1, prompt=NEW, seed=3)
    recached = run_blocks(tiny_pipeline, 1, prompt=NEW, seed=3, extra={"recache": True})
    assert torch.equal(plain[0].extra["latents"], recached[0].extra["latents"])


@pytest.mark.slow  # end to end through the CLI: a schedule with on_switch: recache
def test_a_rollout_with_on_switch_recache(tiny_dir, ardiff_main, monkeypatch, tmp_path):
    from ardiff.pipelines.causal_wan import pipeline as pipeline_module

    calls = []

    def spy(transformer, state, branch, *args):
        calls.append((branch, state.kept_frames(branch)))
        return recache_branch(transformer, state, branch, *args)

    monkeypatch.setattr(pipeline_module, "recache_branch", spy)
    monkeypatch.chdir(tiny_dir.parent)
    schedule = ('[{frame: 0, prompt: "a red ball"}, '
                '{frame: 33, prompt: "a blue cube", on_switch: recache}]')
    out = tmp_path / "x.mp4"
    result = ardiff_main("rollout", TINY_CONFIG, "-o", out, "--quiet", "--set",
                         "rollout.frames=45", "--set", f"rollout.prompt={schedule}",
                         "--json", tmp_path / "run.json")
    assert result.exit_code == 0, result.output
    import av

    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 45
    # block 3 (video frames 33..44) after 9 latent frames, 3..5 evicted by the window 6
    assert calls == [("main", [0, 1, 2, 6, 7, 8])]

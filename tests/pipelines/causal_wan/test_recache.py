"""`on_switch: recache` is LongLive v1.0's interactive recache: a rollout through switches
before the cache is full and after it equals LongLive's semantics written out independently on
diffusers' stock forward (every frame at its own position, a mask for what each frame reads,
and the K/V each frame is read with injected from the forward that wrote them)."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch
from extras import require_extra

require_extra("wan")
import diffusers.models.transformers.transformer_wan as transformer_wan  # noqa: E402
from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402
from wan_reference import MaskedAttention  # noqa: E402

from ardiff import RolloutRequest  # noqa: E402
from ardiff.engine.runner import Runner  # noqa: E402
from ardiff.kv.backend import create_cache  # noqa: E402
from ardiff.kv.plan import make_plan  # noqa: E402
from ardiff.pipelines.causal_wan import CausalWan  # noqa: E402
from ardiff.pipelines.causal_wan.recache import (  # noqa: E402
    KeptLatents,
    kept_latents_bytes,
    recache_branch,
    recache_range,
)

TOLERANCE = 1e-4  # relative, per block, float32
PROMPTS = ["a cat walks on the beach", "a dog swims in a lake", "a red ball"]
TINY_CONFIG = Path(__file__).parents[3] / "configs" / "causal-wan-tiny.yaml"
SINK, WINDOW, BLOCK = 3, 9, 3  # LongLive's local_attn_size 12, sink 3, blocks of 3


@pytest.fixture(scope="module")
def longlive_like(tiny_args):
    """The tiny model with LongLive's window: sink 3, window 9 (local_attn_size 12)."""
    pipeline = CausalWan(**{**tiny_args, "window_frames": WINDOW, "sink_frames": SINK})
    pipeline.load("cpu", torch.float32)
    return pipeline


class LongLiveReference:
    """LongLive v1.0's interactive rollout (global_sink: true, context_noise 0) in its own
    words. `kv[f]`: per layer, the K/V its cache holds for frame f (post-RoPE)."""

    def __init__(self, pipeline) -> None:
        self.model = copy.deepcopy(pipeline.transformer.model)
        self.pipeline = pipeline
        self.tpf = pipeline.ar_diffusion_kv_cache_spec().tokens_per_frame
        self.kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.clean: list[torch.Tensor] = []  # [1, C, 1, h, w] per frame

    def rows(self, frame: int) -> slice:
        return slice(frame * self.tpf, (frame + 1) * self.tpf)

    def forward(self, latents, timesteps, prompt, reads: dict[int, list[int]],
                live: list[int], record: bool) -> torch.Tensor:
        """The stock model over `latents` [1, C, F, h, w]: frame f reads the frames reads[f]
        (others only themselves); frames read but not `live` are read with the K/V their
        cache holds; with `record` the live frames' K/V become what the cache holds."""
        frames = latents.shape[2]
        visible = torch.eye(frames, dtype=torch.bool)
        for row, cols in reads.items():
            visible[row] = False
            visible[row, cols] = True
        mask = visible.repeat_interleave(self.tpf, 0).repeat_interleave(self.tpf, 1)
        injected = sorted({f for cols in reads.values() for f in cols} - set(live))
        processors = {name: MaskedAttention(mask) if ".attn1." in name else WanAttnProcessor()
                      for name in self.model.attn_processors}
        self.model.set_attn_processor(processors)
        recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
        stock = transformer_wan.dispatch_attention_fn

        def injecting(query, key, value, attn_mask=None, **kwargs):
            if attn_mask is mask:  # self-attention of layer len(recorded): [1, tokens, h, hs]
                key, value = key.clone(), value.clone()
                for frame in injected:
                    held_k, held_v = self.kv[frame][len(recorded)]
                    key[0, self.rows(frame)], value[0, self.rows(frame)] = held_k, held_v
                recorded.append((key[0], value[0]))
            return stock(query, key, value, attn_mask=attn_mask, **kwargs)

        per_token = torch.tensor(timesteps).repeat_interleave(self.tpf)[None]
        embeds = self.pipeline.prompt_encoder.encode(prompt)
        transformer_wan.dispatch_attention_fn = injecting
        try:
            with torch.inference_mode():
                out = self.model(latents, per_token, embeds, return_dict=False)[0]
        finally:
            transformer_wan.dispatch_attention_fn = stock
        for frame in live if record else []:
            self.kv[frame] = [(k[self.rows(frame)], v[self.rows(frame)]) for k, v in recorded]
        return out

    def history(self, end: int) -> list[int]:
        """What a block at frame `end` reads: the sink and the last WINDOW - BLOCK frames."""
        return sorted(set(range(min(SINK, end))) | set(range(max(0, end - WINDOW + BLOCK), end)))

    def recache(self, end: int, prompt: str) -> None:
        """`_recache_after_switch`: the last min(L, end) clean frames at t = 0 in one forward,
        no mask among them; past L the write starts after the sink (the sink keeps its K/V,
        the first SINK frames re-run are neither written nor read)."""
        local = SINK + WINDOW
        first = end - min(local, end)
        written = list(range(first + SINK if first > 0 else 0, end))
        reads = (list(range(SINK)) if first > 0 else []) + written
        self.forward(torch.cat(self.clean[:end], dim=2), [0.0] * end, prompt,
                     {f: reads for f in range(first, end)}, written, record=True)

    def block(self, index: int, prompt: str, seed: int) -> torch.Tensor:
        """One block: every step reads history + itself; the clean block is committed at t = 0."""
        pipeline, end = self.pipeline, index * BLOCK
        table, timesteps = pipeline.config.preset.table, pipeline.config.timesteps()
        shape, cpu = pipeline.config.latent_shape, torch.device("cpu")
        own = list(range(end, end + BLOCK))
        reads = {f: self.history(end) + own for f in own}
        x = pipeline.noise(seed, index, 0, shape, cpu, torch.float32)
        for step, t in enumerate(timesteps):
            inputs = torch.cat([*self.clean[:end], x], dim=2)
            flow = self.forward(inputs, [0.0] * end + [t] * BLOCK, prompt, reads, own, False)
            clean = (x.double() - table.sigma(t) * flow[:, :, end:].double()).float()
            if step + 1 < len(timesteps):
                sigma = table.sigma(timesteps[step + 1])
                noise = pipeline.noise(seed, index, step + 1, shape, cpu, torch.float32)
                x = (1 - sigma) * clean + sigma * noise
        self.forward(torch.cat([*self.clean[:end], clean], dim=2), [0.0] * (end + BLOCK),
                     prompt, reads, own, record=True)
        self.clean += list(clean.split(1, dim=2))
        return clean


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


def schedule(blocks: int, switches: dict[int, int]) -> list[tuple[str, bool]]:
    """(prompt, switches here) per block; `switches`: block -> prompt index."""
    out, prompt = [], PROMPTS[0]
    for block in range(blocks):
        if block in switches:
            prompt = PROMPTS[switches[block]]
        out.append((prompt, block in switches))
    return out


def run_ardiff(pipeline, plan_blocks: list[tuple[str, bool]], seed: int, backend: str) -> list:
    plan = make_plan(pipeline.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 30)
    runner = Runner(pipeline, create_cache(plan, backend, "cpu", poison=True), "cpu")
    with contextlib.closing(runner):
        return [runner.execute(RolloutRequest(
            "s", block_index=i, prompt=prompt, seed=seed, clear_cross_kv=switch,
            extra={"recache": True} if switch else {})).output.extra["latents"]
            for i, (prompt, switch) in enumerate(plan_blocks)]


def test_recache_range_is_longlives_last_frames_less_the_inert_sink():
    assert [recache_range(t, 3, 9) for t in (0, 3, 9, 12, 15, 18)] == [
        (0, 0), (0, 3), (0, 9), (0, 12), (6, 9), (9, 9)]
    assert recache_range(30, 0, 21) == (9, 21)  # no sink: the last local_attn_size frames


def test_a_rollout_through_switches_before_and_after_the_cache_fills_equals_longlive(
        longlive_like):
    """Switches at latent frames 9 (cache of 12 not full: frames 0..8, sink rewritten) and
    18 (full: frames 9..17 read the old sink; 9..11 context only), paged = dense."""
    pipeline, seed = longlive_like, 5
    blocks = schedule(7, {3: 1, 6: 2})
    ours = {backend: run_ardiff(pipeline, blocks, seed, backend) for backend in ("paged", "dense")}
    for paged, dense in zip(*ours.values()):
        assert torch.equal(paged, dense)
    assert pipeline.kept_latents.nbytes("s") == 0  # the runner closed the session
    reference = LongLiveReference(pipeline)
    errors = []
    for index, (prompt, switch) in enumerate(blocks):
        if switch:
            reference.recache(index * BLOCK, prompt)
        errors.append(relative_error(ours["paged"][index], reference.block(index, prompt, seed)))
    assert max(errors) <= TOLERANCE, errors


def test_kept_latents_hold_the_frames_a_recache_reruns(longlive_like):
    kept, c = KeptLatents(), longlive_like.config
    block = torch.zeros(1, 16, 3, c.latent_height, c.latent_width)
    for index in range(6):
        kept.record("s", 3 * index, block + index, SINK, WINDOW)
        end = 3 * index + 3
        first, count = recache_range(end, SINK, WINDOW)
        assert kept.get("s", first, count).shape[2] == count
        assert kept.nbytes("s") <= kept_latents_bytes(c)
    assert kept.nbytes("s") == 9 * kept_latents_bytes(c) // 12  # past L: the last W frames
    with pytest.raises(Exception, match=r"needs the clean latents of frames \[0, 1, 2\]"):
        kept.get("s", 0, 3)


def test_a_recache_on_a_fresh_session_is_a_plain_block(tiny_pipeline, run_blocks):
    plain = run_blocks(tiny_pipeline, 1, prompt=PROMPTS[1], seed=3)
    recached = run_blocks(tiny_pipeline, 1, prompt=PROMPTS[1], seed=3, extra={"recache": True})
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
    switches = ('[{frame: 0, prompt: "a red ball"}, '
                '{frame: 33, prompt: "a blue cube", on_switch: recache}]')
    out = tmp_path / "x.mp4"
    result = ardiff_main("rollout", TINY_CONFIG, "-o", out, "--quiet", "--set",
                         "rollout.frames=45", "--set", f"rollout.prompt={switches}",
                         "--json", tmp_path / "run.json")
    assert result.exit_code == 0, result.output
    import av

    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 45
    # block 3 (video frames 33..44) after 9 latent frames, 3..5 evicted by the window 6
    assert calls == [("main", [0, 1, 2, 6, 7, 8])]

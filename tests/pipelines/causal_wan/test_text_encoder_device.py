"""`pipeline.args.text_encoder_device` (#24): where UMT5 runs (auto places it by what fits),
that the frames do not depend on it, and that a prompt is encoded once however many
sessions use it (the CFG branches and a switch back go through the same cache)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
from extras import require_extra

require_extra("wan")

import torch  # noqa: E402

from ardiff.errors import ConfigError  # noqa: E402
from ardiff.pipelines.causal_wan import CausalWan  # noqa: E402
from ardiff.pipelines.causal_wan.text import CACHED_PROMPTS  # noqa: E402

PROMPT = "a red fox runs through snow"


def frames(outputs) -> torch.Tensor:
    return torch.cat([o.frames for o in outputs])


@contextlib.contextmanager
def count_encodes(pipeline) -> Iterator[list[int]]:
    """A list that grows by one per forward of the pipeline's UMT5 encoder, while inside."""
    calls: list[int] = []
    hook = pipeline.prompt_encoder.encoder.register_forward_hook(lambda *a: calls.append(1))
    try:
        yield calls
    finally:
        hook.remove()


@pytest.mark.parametrize("fits, expected", [(True, "cuda:0"), (False, "cpu")])
def test_auto_puts_the_encoder_on_the_device_only_if_everything_fits(tiny_args, fits, expected):
    pipeline = CausalWan(**tiny_args)
    asked = []
    devices = pipeline.place_weights("cuda:0", lambda parts: asked.append(parts) or fits)
    assert devices == {"transformer": "cuda:0", "text_encoder": expected, "vae": "cuda:0"}
    assert sorted(asked[0]) == ["text_encoder", "transformer", "vae"]


def test_a_named_device_is_taken_as_given(tiny_args):
    pipeline = CausalWan(**tiny_args, text_encoder_device="cpu")
    assert pipeline.place_weights("cuda", lambda parts: True)["text_encoder"] == "cpu"


@pytest.mark.parametrize("value", ["gpu", "cuda:x", 0])
def test_a_bad_device_is_one_line(tiny_args, value):
    with pytest.raises(ConfigError, match=r"^pipeline\.args\.text_encoder_device: .* is not "
                                          r"allowed; use auto, cpu, cuda or cuda:N$"):
        CausalWan(**tiny_args, text_encoder_device=value)


def test_an_encoder_on_the_cpu_gives_the_frames_of_one_on_the_run_device(
        tiny_args, tiny_pipeline, run_blocks):
    """The run device here is the CPU too; test_on_cuda_... below runs it across devices."""
    pipeline = CausalWan(**tiny_args)
    pipeline.place_weights("cpu", lambda parts: False)
    pipeline.load("cpu", torch.float32)
    assert next(pipeline.prompt_encoder.encoder.parameters()).device.type == "cpu"
    assert torch.equal(frames(run_blocks(pipeline, 1, prompt=PROMPT, seed=3)),
                       frames(run_blocks(tiny_pipeline, 1, prompt=PROMPT, seed=3)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_an_encoder_on_the_cpu_gives_the_same_frames(tiny_args, run_blocks):
    outputs = {}
    for encoder in ("cuda", "cpu"):
        pipeline = CausalWan(**tiny_args, text_encoder_device=encoder)
        pipeline.place_weights("cuda", lambda parts: True)
        pipeline.load("cuda", torch.float32)
        assert next(pipeline.prompt_encoder.encoder.parameters()).device.type == encoder
        outputs[encoder] = frames(run_blocks(pipeline, 2, prompt=PROMPT, seed=3))
    # UMT5's float32 states on two devices differ in their last bits; uint8 frames by <= 1
    assert (outputs["cuda"].int() - outputs["cpu"].int()).abs().max() <= 1


def test_a_prompt_is_encoded_once_for_every_session(tiny_pipeline, run_blocks):
    with count_encodes(tiny_pipeline) as calls:
        run_blocks(tiny_pipeline, 1, prompt="a fox, once")
        assert len(calls) == 1
        run_blocks(tiny_pipeline, 1, prompt="a fox, once")   # another session, the same prompt
        assert len(calls) == 1
        run_blocks(tiny_pipeline, 1, prompt="a blue fox")
        assert len(calls) == 2


def test_the_cache_keeps_the_latest_prompts(tiny_pipeline):
    encoder = tiny_pipeline.prompt_encoder
    prompts = [f"prompt number {i}" for i in range(CACHED_PROMPTS + 1)]
    with count_encodes(tiny_pipeline) as calls:
        states = [encoder.encode(p) for p in prompts]
        assert len(calls) == CACHED_PROMPTS + 1
        assert encoder.encode(prompts[-1]) is states[-1] and len(calls) == CACHED_PROMPTS + 1
        assert torch.equal(encoder.encode(prompts[0]), states[0])  # evicted: encoded again
        assert len(calls) == CACHED_PROMPTS + 2

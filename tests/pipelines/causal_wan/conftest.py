"""Fixtures of the causal-Wan tests: one tiny random model folder per test session (made by
the `make_tiny` tool, no hub access) and one pipeline loaded from it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from extras import require_extra

TINY_HEIGHT, TINY_WIDTH = 48, 64     # 6 x 8 latents, 3 x 4 = 12 tokens per frame
TINY_TEXT_LEN = 16


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny diffusers-layout folder with self_forcing.pt and lora.pt beside the models."""
    require_extra("wan")
    from ardiff.pipelines.causal_wan.make_tiny import write_model

    out = tmp_path_factory.mktemp("models") / "causal-wan-tiny"  # the name the tiny config uses
    write_model(out)
    return out


@pytest.fixture(scope="session")
def tiny_args(tiny_dir) -> dict:
    """Pipeline args for the tiny folder: a window that evicts within four blocks."""
    return dict(model_dir=str(tiny_dir), generator_ckpt=str(tiny_dir / "self_forcing.pt"),
                height=TINY_HEIGHT, width=TINY_WIDTH, text_len=TINY_TEXT_LEN,
                window_frames=6, sink_frames=3, vae_dtype="float32")


@pytest.fixture(scope="session")
def tiny_pipeline(tiny_args):
    """One loaded `CausalWan` (float32, CPU) shared by the tests that only run sessions."""
    from ardiff.pipelines.causal_wan import CausalWan

    pipeline = CausalWan(**tiny_args)
    pipeline.load("cpu", torch.float32)
    return pipeline


@pytest.fixture
def run_blocks():
    """`run_blocks(pipeline, blocks, backend="paged", **request) -> [BlockOutput]`: one session
    on a fresh runner (paged pages poisoned with NaN), closed afterwards."""
    from ardiff import RolloutRequest
    from ardiff.engine.runner import Runner
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan

    def run(pipeline, blocks: int, backend: str = "paged", **request) -> list:
        plan = make_plan(pipeline.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 30)
        runner = Runner(pipeline, create_cache(plan, backend, "cpu", poison=True), "cpu")
        with contextlib.closing(runner):
            return [runner.execute(RolloutRequest("s", block_index=i, **request)).output
                    for i in range(blocks)]

    return run

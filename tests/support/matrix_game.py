"""Helpers of the Matrix-Game tests: the tiny folder's checkpoints, a loaded pipeline, a runner."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

CHECKPOINTS = {"universal": "base_distilled_model/base_distill.safetensors",
               "gta_drive": "gta_distilled_model/gta_keyboard2dim.safetensors",
               "templerun": "templerun_distilled_model/templerun_7dim_onlykey.safetensors"}
SMALL = dict(height=32, width=64)  # 2 x 4 tokens a frame: the CPU tests' size


def make_pipeline(mg_dir: Path, mode: str = "universal", **args):
    from ardiff.pipelines.matrix_game import MatrixGame

    pipeline = MatrixGame(model_dir=str(mg_dir), checkpoint=CHECKPOINTS[mode], mode=mode,
                          vae_dtype="float32", **{**SMALL, **args})
    pipeline.load("cpu", torch.float32)
    return pipeline


@contextlib.contextmanager
def make_runner(pipeline, batch_rows: int = 1):
    from ardiff.engine.runner import Runner
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan

    plan = make_plan(pipeline.ar_diffusion_kv_cache_spec(), "float32", 4, 1 << 30,
                     batch_rows=batch_rows)
    runner = Runner(pipeline, create_cache(plan, "paged", "cpu", poison=True), "cpu")
    with contextlib.closing(runner):
        yield runner

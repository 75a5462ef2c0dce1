"""Helpers shared by the runner tests: a runner over the probe pipeline, and its numbers."""

from __future__ import annotations

from pathlib import Path

import probe_pipeline as probe
import yaml

import ardiff
from ardiff.engine.loader import get_spec
from ardiff.engine.runner import Runner
from ardiff.kv.backend import create_cache
from ardiff.kv.plan import make_plan

PIPELINES_FILE = Path(__file__).parent / "probe_pipeline.py"
BIG_BUDGET = 1 << 30
HISTORY_PAGES = 3  # the probe spec keeps sink 1 + (window 4 - block 2) frames, one page each


def make_runner(pipeline=None, capacity: int = 2, backend: str = "paged") -> Runner:
    pipeline = pipeline or probe.ProbePipeline()
    plan = make_plan(get_spec(pipeline), "float32", 4, BIG_BUDGET, max_sessions=capacity)
    return Runner(pipeline, create_cache(plan, backend, "cpu", poison=backend == "paged"))


def run(runner: Runner, session_id: str, num_blocks: int, first_block: int = 0, **fields):
    return [runner.execute(ardiff.RolloutRequest(session_id, block_index=b, **fields)).output
            for b in range(first_block, first_block + num_blocks)]


def frame_ids(output: ardiff.BlockOutput) -> list[int]:
    """The probe paints each frame with its absolute index."""
    return output.frames[:, 0, 0, 0].tolist()


def pages_in_use(runner: Runner) -> int | None:
    return runner.cache.stats().pages_in_use


def probe_config(tmp_path: Path, cls: str = "ProbePipeline", args: dict | None = None,
                 **runtime) -> Path:
    data = {"pipeline": {"entry": f"{PIPELINES_FILE}:{cls}", "args": args or {}},
            "runtime": {"device": "cpu", "memory_budget": "64MiB", **runtime}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path

"""`ardiff bench --workers N`: the same job on one worker and on N, side by side.

    report = measure_speedup(config, workers=2, repeats=3)

Runs alternate (1, N, 1, N, ...) so a changing machine load hurts both alike. Each run is
the whole job as `ardiff rollout --workers K` runs it (K spawned ranks; the one-worker arm
spawns one too, so both pay the same start-up), with threads per rank from
`runtime.parallel.threads`. Outputs go to a scratch folder as `.npy`, so the arms' frames
are compared exactly. The speedup is the ratio of median wall times, printed beside the
ideal (N) and the load average; nothing here is a pass/fail test.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ardiff.config.run import RunConfig, with_base_dir
from ardiff.distributed.topology import local_ranks
from ardiff.errors import RunError
from ardiff.launch.parent import prepare_job, run_parallel_rollout

TARGET_WALL_RATIO = 0.6  # docs/several-devices.md: 2 workers on 2 cores take <= 0.6x one's time


@dataclass
class Arm:
    """One side of the comparison: its wall and rollout times, one per repeat."""

    workers: int
    wall_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    frames: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "wall_s": self.wall_s, "rollout_s": self.rollout_s,
                "wall_s_median": statistics.median(self.wall_s),
                "rollout_s_median": statistics.median(self.rollout_s), "frames": self.frames}


@dataclass
class SpeedupReport:
    one: Arm
    many: Arm
    frames_identical: bool
    load_average: tuple[float, float, float]

    @property
    def speedup(self) -> float:
        return statistics.median(self.one.wall_s) / statistics.median(self.many.wall_s)

    @property
    def rollout_speedup(self) -> float:
        return statistics.median(self.one.rollout_s) / statistics.median(self.many.rollout_s)

    def to_dict(self) -> dict[str, Any]:
        return {"one_worker": self.one.to_dict(), "workers": self.many.to_dict(),
                "speedup": self.speedup, "rollout_speedup": self.rollout_speedup,
                "ideal": float(self.many.workers),
                "wall_ratio": 1 / self.speedup, "target_wall_ratio": TARGET_WALL_RATIO,
                "frames_identical": self.frames_identical,
                "load_average": list(self.load_average)}


def measure_speedup(config: RunConfig, workers: int, repeats: int = 3,
                    on_progress: Callable[[str], None] | None = None) -> SpeedupReport:
    """Run the config's job `repeats` times on 1 and on `workers` workers, alternating.
    Both jobs are checked (`prepare_job`) before the first one runs: bad input raises
    ConfigError (exit 2), not after the one-worker runs."""
    say = on_progress or (lambda message: None)
    one, many = Arm(1), Arm(workers)
    with tempfile.TemporaryDirectory(prefix="ardiff-speedup-") as scratch:
        for arm in (one, many):
            arm_config = _arm_config(config, arm.workers, Path(scratch))
            prepare_job(arm_config, local_ranks(arm_config.runtime.parallel))
        outputs: dict[int, list[Any]] = {}
        for repeat in range(repeats):
            for arm in (one, many):
                say(f"repeat {repeat + 1}/{repeats}: {arm.workers} worker(s)")
                outputs[arm.workers] = _run(config, arm, Path(scratch) / f"w{arm.workers}")
        identical = _equal(outputs[1], outputs[workers])
    return SpeedupReport(one, many, identical, os.getloadavg())


def _run(config: RunConfig, arm: Arm, folder: Path) -> list[Any]:
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report = run_parallel_rollout(_arm_config(config, arm.workers, folder))
    arm.wall_s.append(time.perf_counter() - start)
    if report.status != "ok":
        raise RunError(f"bench --workers: the {arm.workers}-worker run {report.status}: "
                       f"{report.error}")
    arm.rollout_s.append(report.rollout_s)
    arm.frames = report.frames_written
    return [np.load(output.path) for output in report.outputs]


def _arm_config(config: RunConfig, workers: int, folder: Path) -> RunConfig:
    runtime = config.runtime
    parallel = dataclasses.replace(runtime.parallel, workers=workers)
    output = dataclasses.replace(config.output, path=str(folder / "stream-{index}.npy"))
    changed = dataclasses.replace(config, output=output,
                                  runtime=dataclasses.replace(runtime, parallel=parallel))
    return with_base_dir(changed, config.base_dir)


def _equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))

"""`reference_loop` (ardiff/bench/references.py) asks the pipeline's optional `reference_loop(spec)`
hook: a fresh loop per session under the effective spec, the pipeline's reason, or NO_LOOP."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import ardiff
from ardiff.bench.references import NO_LOOP, NO_RESET_LOOP, reference_loop
from ardiff.pipelines.tiny_dit import TinyCausalDiT

SPEC = ardiff.ARDiffusionKVCacheSpec(1, 1, 4, 2, 2, 4, (ardiff.ARDiffusionKVBranchSpec("main", 0),),
                                     1, sink_frames=1)


class Loop:
    def __init__(self, spec: ardiff.ARDiffusionKVCacheSpec) -> None:
        self.spec = spec

    def step(self, request: ardiff.RolloutRequest):
        return None


class WithLoop:
    def reference_loop(self, spec):
        return Loop(spec)


class WithReason:
    def reference_loop(self, spec):
        return "not with these settings"


def test_each_call_of_the_factory_makes_a_fresh_loop_under_the_spec_it_was_given():
    new_loop, why_not = reference_loop(WithLoop(), SPEC)
    assert why_not is None
    first, second = new_loop(), new_loop()
    assert first is not second and first.spec is SPEC and second.spec is SPEC


@pytest.mark.parametrize("pipeline, spec, why", [
    (object(), SPEC, NO_LOOP),                                          # no hook
    (WithReason(), SPEC, "not with these settings"),                    # the pipeline's reason
    (WithLoop(), dataclasses.replace(SPEC, reset_at_boundary=True), NO_RESET_LOOP),
    (TinyCausalDiT(cfg=True), SPEC, "the tiny DiT's reference loop runs one branch "
                                    "(pipeline.args.cfg: false)"),
])
def test_without_a_loop_the_bench_is_told_why(pipeline, spec, why):
    assert reference_loop(pipeline, spec) == (None, why)


@pytest.mark.slow  # a fresh interpreter: what importing the bench loads
def test_the_bench_imports_no_pipeline():
    code = ("import sys, ardiff.bench.run; "
            "print([m for m in sys.modules if m.startswith('ardiff.pipelines')])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

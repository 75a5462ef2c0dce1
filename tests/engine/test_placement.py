"""Weights beside the KV plan (ardiff/engine/placement.py, #24): the `weight_bytes` and
`place_weights` hooks, the fit arithmetic, and `build_runner` asking where the weights go
before `load`.

`spec_pipelines.WeightedPipeline` on TINY_SPEC in float32 under a 1MiB budget: a KV plan of
13,824 bytes (4 sessions of 3,072 + 1,536 shared); weights "model" 40,000 and "encoder"
60,000 bytes.
"""

from __future__ import annotations

import pytest
from spec_pipelines import GoodPipeline, WeightedPipeline

from ardiff.config.run import build_config
from ardiff.engine import build
from ardiff.engine.build import build_runner
from ardiff.engine.placement import (
    ACTIVATION_MARGIN_BYTES,
    AUTO,
    CUDA_CONTEXT_BYTES,
    MIN_ACTIVATION_BYTES,
    MemoryFit,
    WeightPlan,
    activation_margin,
    fits_in,
    get_weight_bytes,
    parse_device_memory,
    place_weights,
    same_device,
)
from ardiff.errors import ConfigError, PipelineLoadError

KV_BYTES = 13_824
MODEL, ENCODER = 40_000, 60_000


def weighted_config(**args):
    return build_config({"pipeline": {"entry": "spec_pipelines:WeightedPipeline", "args": args},
                         "runtime": {"device": "cpu", "memory_budget": "1MiB"}})


def test_the_margin_scales_with_the_model_unless_it_declares_its_activations():
    """An estimate: a quarter of the weights on the device (with a floor), or what the
    pipeline declares; the CUDA context on top on CUDA (#35: not a flat 3GiB for any model)."""
    undeclared = activation_margin(GoodPipeline(), "float32", "cpu")
    assert undeclared(0) == MIN_ACTIVATION_BYTES
    assert undeclared(8 * 2**30) == 2 * 2**30
    on_cuda = activation_margin(GoodPipeline(), "bfloat16", "cuda:0")
    assert on_cuda(8 * 2**30) == 2 * 2**30 + CUDA_CONTEXT_BYTES
    declared = activation_margin(WeightedPipeline(), "float32", "cuda")
    assert declared(0) == declared(2**40) == 3 * 2**30 + CUDA_CONTEXT_BYTES


def test_an_activation_bytes_that_is_not_bytes_is_one_line():
    class Wrong(GoodPipeline):
        def activation_bytes(self, dtype):
            return "lots"
    with pytest.raises(PipelineLoadError, match=r"^pipeline: activation_bytes\('float32'\) "
                                                r"returned 'lots'; it must return bytes, an "
                                                r"int >= 0$"):
        activation_margin(Wrong(), "float32", "cpu")


def test_the_fit_is_weights_plus_kv_plus_the_margin():
    fit = MemoryFit(memory_bytes=ACTIVATION_MARGIN_BYTES + 100, weight_bytes=60, kv_bytes=40)
    assert (fit.needed_bytes, fit.fits) == (ACTIVATION_MARGIN_BYTES + 100, True)
    assert not MemoryFit(ACTIVATION_MARGIN_BYTES + 99, 60, 40).fits
    assert fit.to_dict() == {"memory_bytes": ACTIVATION_MARGIN_BYTES + 100, "weight_bytes": 60,
                             "kv_bytes": 40, "margin_bytes": ACTIVATION_MARGIN_BYTES,
                             "needed_bytes": ACTIVATION_MARGIN_BYTES + 100, "fits": True}


def test_fits_plans_the_kv_with_the_memory_the_weights_leave():
    from ardiff.errors import CapacityError

    def half_of_free(free: int) -> int:   # a fraction budget: 0.5 of what is left
        if free < 1000:
            raise CapacityError("not one session")
        return free // 2

    margin = ACTIVATION_MARGIN_BYTES
    fits = fits_in(3 * margin, half_of_free)       # w + (3m - w) / 2 + m <= 3m: w <= m
    assert fits(margin) and not fits(margin + 2)
    assert not fits(3 * margin - 500)              # 500 bytes left: not one session


def test_cuda_and_cuda_0_are_one_device():
    assert same_device("cuda", "cuda:0") and same_device("cuda:1", "cuda:1")
    assert not same_device("cuda:1", "cuda") and not same_device("cpu", "cuda")


@pytest.mark.parametrize("value, num_bytes", [("24GiB", 24 * 2**30), ("80GB", 80 * 10**9),
                                              ("25769803776", 25769803776)])
def test_device_memory_is_bytes(value, num_bytes):
    assert parse_device_memory(value) == num_bytes


@pytest.mark.parametrize("value", ["lots", "0.8", "0", "-1GiB", "24 apples"])
def test_device_memory_that_is_not_bytes_names_the_flag(value):
    with pytest.raises(ConfigError, match=r"^--device-memory: .* is not a size in bytes; give "
                                          r"the device's memory like 24GiB, 80GB or "
                                          r"25769803776$"):
        parse_device_memory(value)


def test_a_pipeline_without_the_hooks_has_no_weights_and_everything_on_the_device():
    assert get_weight_bytes(GoodPipeline(), "float32") is None
    plan = place_weights(GoodPipeline(), {"a": 1}, "cuda", lambda n: False)
    assert plan.devices == {"a": "cuda"} and plan.device_bytes == 1


def test_the_pipeline_places_by_what_fits():
    pipeline = WeightedPipeline()
    parts = get_weight_bytes(pipeline, "float32")
    assert parts == {"model": MODEL, "encoder": ENCODER}
    asked = []
    roomy = place_weights(pipeline, parts, "cuda", lambda n: asked.append(n) or True)
    assert asked == [MODEL + ENCODER]                    # the bytes of the parts it named
    assert roomy.devices == {"model": "cuda", "encoder": "cuda"}
    tight = place_weights(pipeline, parts, "cuda", lambda n: False)
    assert tight.devices == {"model": "cuda", "encoder": "cpu"}
    assert (tight.device_bytes, tight.total_bytes) == (MODEL, MODEL + ENCODER)


def test_an_unknown_memory_leaves_the_choice_open():
    plan = place_weights(WeightedPipeline(), {"model": MODEL, "encoder": ENCODER}, "cuda", None)
    assert plan.devices == {"model": "cuda", "encoder": AUTO}
    fixed = place_weights(WeightedPipeline(encoder_device="cpu"),
                          {"model": MODEL, "encoder": ENCODER}, "cuda", None)
    assert fixed.devices == {"model": "cuda", "encoder": "cpu"}
    assert WeightPlan({"a": 1}, {"a": AUTO}, "cuda").to_dict() == {
        "parts": {"a": {"bytes": 1, "device": AUTO}}, "device_bytes": 1, "total_bytes": 1}


@pytest.mark.parametrize("bad, message", [
    ("weight_bytes", r"^pipeline: weight_bytes\('float32'\) returned \[\('model', 1\)\]; it must "
                     r"return a mapping of part names to bytes, like \{'transformer': "),
    ("place_weights", r"^pipeline: place_weights\('cpu', fits\) returned \{'model': 'cpu'\}; it "
                      r"must map each part of weight_bytes \(model, encoder\) to a device name"),
])
def test_a_hook_that_returns_the_wrong_thing_is_one_line(bad, message):
    pipeline = WeightedPipeline(bad=bad)
    with pytest.raises(PipelineLoadError, match=message):
        parts = get_weight_bytes(pipeline, "float32")
        place_weights(pipeline, parts or {}, "cpu", lambda n: True)


@pytest.mark.parametrize("free_bytes, placed", [
    (ACTIVATION_MARGIN_BYTES + MODEL + ENCODER + KV_BYTES, "cpu"),     # all fit: the run device
    (ACTIVATION_MARGIN_BYTES + MODEL + ENCODER + KV_BYTES - 1, "elsewhere"),
])
def test_build_runner_places_the_weights_by_free_memory_before_load(monkeypatch, free_bytes,
                                                                    placed):
    monkeypatch.setattr(build, "free_memory_bytes", lambda device: free_bytes)
    config = weighted_config(offload_to="elsewhere")
    resolved = build.resolve(config)
    runner = build_runner(config, resolved)
    try:
        assert resolved.pipeline.placements == [placed]
        assert resolved.pipeline.load_calls and runner.plan.total_bytes == KV_BYTES
    finally:
        runner.close()

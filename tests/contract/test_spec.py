"""ardiff/contract/spec.py: the upstream contract field for field, every validation rule with its
message, the derived properties, overrides and protocols."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from spec_pipelines import TINY_SPEC, GoodPipeline, MissingMethodsPipeline

from ardiff.contract import (
    PIPELINE_METHODS,
    SupportsARDiffusionBlockGeneration,
    missing_pipeline_methods,
)
from ardiff.contract.spec import ARDiffusionCrossAttentionKVSpec as Cross
from ardiff.contract.spec import ARDiffusionKVBranchSpec as Branch
from ardiff.contract.spec import ARDiffusionKVCacheSpec as Spec
from ardiff.contract.spec import (
    SupportsARDiffusionPipeline,
    SupportsARDiffusionWarmup,
    apply_overrides,
    find_branch,
    history_frames_per_branch,
    spec_to_dict,
)
from ardiff.errors import ConfigError, SpecError


def make(**changes) -> Spec:
    return Spec(**{**TINY_SPEC, **changes})


def raises(message: str):
    """pytest.raises(SpecError) whose message must contain `message` literally."""
    return pytest.raises(SpecError, match=re.escape(message))


# ---- scalar fields -------------------------------------------------------------------------

POSITIVE = ("num_layers", "num_kv_heads", "head_size", "tokens_per_frame", "frames_per_block",
            "window_frames", "session_capacity", "max_model_len")
NON_NEGATIVE = ("sink_frames", "max_scratch_tokens_per_branch",
                "model_owned_state_bytes_per_session")


@pytest.mark.parametrize("name", POSITIVE)
@pytest.mark.parametrize("value", [0, -3])
def test_positive_fields_reject_zero_and_negative(name, value):
    with raises(f"spec.{name}: {value} is invalid; it must be an integer > 0"):
        make(**{name: value})


@pytest.mark.parametrize("name", NON_NEGATIVE)
def test_non_negative_fields_accept_zero_and_reject_negative(name):
    assert getattr(make(**{name: 0}), name) == 0
    with raises(f"spec.{name}: -1 is invalid; it must be an integer >= 0"):
        make(**{name: -1})


@pytest.mark.parametrize("name", POSITIVE + NON_NEGATIVE)
@pytest.mark.parametrize("value", [True, 2.0, "2", None])
def test_integer_fields_reject_bools_floats_strings_and_none(name, value):
    with raises(f"spec.{name}: {value!r} is invalid; it must be an integer"):
        make(**{name: value})


def test_reset_at_boundary_takes_a_bool_or_1_0_as_upstream_does():
    assert make(reset_at_boundary=True).reset_at_boundary is True
    assert make(reset_at_boundary=1).reset_at_boundary is True
    assert make(reset_at_boundary=0).reset_at_boundary is False
    for value in (2, "yes", None):
        with raises(f"spec.reset_at_boundary: {value!r} is invalid; it must be true or false "
                    f"(or 1 / 0)"):
            make(reset_at_boundary=value)


def test_any_integer_type_is_accepted_and_stored_as_int():
    np = pytest.importorskip("numpy")
    spec = make(tokens_per_frame=np.int64(6), window_frames=np.int32(5))
    assert (spec.tokens_per_frame, spec.window_frames) == (6, 5)
    assert type(spec.tokens_per_frame) is int and type(spec.window_frames) is int
    assert type(Branch("main", np.int64(0)).local_index) is int
    assert type(Cross("text", np.int16(4)).num_tokens) is int


def test_fields_defaults_and_order_are_the_upstream_contracts():
    fields = [(f.name, f.default) for f in dataclasses.fields(Spec)]
    missing = dataclasses.MISSING
    assert fields == [
        ("num_layers", missing), ("num_kv_heads", missing), ("head_size", missing),
        ("tokens_per_frame", missing), ("frames_per_block", missing), ("window_frames", missing),
        ("kv_branches", missing), ("session_capacity", missing), ("sink_frames", 0),
        ("reset_at_boundary", False), ("cross_attention", ()), ("max_model_len", 1 << 20),
        ("max_scratch_tokens_per_branch", 0), ("model_owned_state_bytes_per_session", 0)]
    assert [f.name for f in dataclasses.fields(Branch)] == ["name", "local_index"]
    assert [f.name for f in dataclasses.fields(Cross)] == ["name", "num_tokens"]
    assert all(f.default is missing for f in (*dataclasses.fields(Branch),
                                              *dataclasses.fields(Cross)))


def test_positional_construction_in_upstream_order():
    spec = Spec(30, 12, 128, 1560, 3, 21, (Branch("main", 0),), 4)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size, spec.tokens_per_frame,
            spec.frames_per_block, spec.window_frames) == (30, 12, 128, 1560, 3, 21)
    assert spec.kv_branches == (Branch("main", 0),) and spec.session_capacity == 4
    assert (spec.sink_frames, spec.reset_at_boundary, spec.cross_attention) == (0, False, ())
    assert spec.max_model_len == 1 << 20
    assert (spec.max_scratch_tokens_per_branch, spec.model_owned_state_bytes_per_session) == (0, 0)


@pytest.mark.parametrize("missing", ["kv_branches", "session_capacity"])
def test_kv_branches_and_session_capacity_are_required(missing):
    fields = {k: v for k, v in TINY_SPEC.items() if k != missing}
    with pytest.raises(TypeError, match=missing):
        Spec(**fields)


def test_spec_errors_are_config_errors_with_exit_code_2():
    with pytest.raises(ConfigError) as info:
        make(num_layers=0)
    assert info.value.exit_code == 2


# ---- branches ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", None, 3])
def test_branch_name_must_be_a_non_empty_string(name):
    with raises(f"spec.kv_branches[].name: {name!r} is invalid; it must be a non-empty string"):
        Branch(name, 0)


def test_a_blank_branch_name_is_as_legal_as_upstream():
    assert Branch(" ", 0).name == " "


@pytest.mark.parametrize("index", [-1, True, 0.0])
def test_branch_local_index_must_be_a_non_negative_int(index):
    with raises(f"spec.kv_branches[cfg].local_index: {index!r} is invalid; "
                f"it must be an integer >= 0"):
        Branch("cfg", index)


@pytest.mark.parametrize("empty", [(), []])
def test_at_least_one_branch(empty):
    with raises("spec.kv_branches: [] is invalid; it must be at least one "
                "ARDiffusionKVBranchSpec"):
        make(kv_branches=empty)


def test_branch_names_are_unique():
    with raises("spec.kv_branches: ['main', 'main'] is invalid; it must be unique branch names"):
        make(kv_branches=(Branch("main", 0), Branch("main", 1)))


def test_branches_must_be_branch_specs():
    with raises("spec.kv_branches: 'main' is invalid; "
                "it must be a tuple of ARDiffusionKVBranchSpec"):
        make(kv_branches=("main",))


@pytest.mark.parametrize("value", [Branch("main", 0), None, "main"])
def test_branches_must_be_a_tuple(value):
    with raises(f"spec.kv_branches: {value!r} is invalid; "
                f"it must be a tuple of ARDiffusionKVBranchSpec"):
        make(kv_branches=value)


def test_local_indices_may_repeat_but_must_cover_zero_to_max():
    shared = make(kv_branches=(Branch("positive", 0), Branch("negative", 0)))
    assert shared.num_local_kv_branches == 1 and len(shared.kv_branches) == 2
    three = make(kv_branches=(Branch("a", 1), Branch("b", 0), Branch("c", 1)))
    assert three.num_local_kv_branches == 2


@pytest.mark.parametrize("indices, shown", [
    ((1,), "[1]"), ((0, 2), "[0, 2]"), ((0, 0, 3), "[0, 3]")])
def test_local_indices_with_a_gap_are_rejected(indices, shown):
    branches = tuple(Branch(f"b{i}", index) for i, index in enumerate(indices))
    with raises(f"spec.kv_branches[].local_index: {shown} is invalid; it must be contiguous "
                f"from 0 (0..max, no gap)"):
        make(kv_branches=branches)


def test_find_branch():
    spec = make(kv_branches=[Branch("positive", 0), Branch("negative", 1)])
    assert find_branch(spec, "negative") == Branch("negative", 1)
    assert find_branch(spec, "main") is None


# ---- cross-attention -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", None])
def test_cross_attention_name_must_be_a_non_empty_string(name):
    with raises(f"spec.cross_attention[].name: {name!r} is invalid; it must be a non-empty string"):
        Cross(name, 4)


@pytest.mark.parametrize("num_tokens", [0, -1, True, 4.0])
def test_cross_attention_num_tokens_must_be_positive(num_tokens):
    with raises(f"spec.cross_attention[text].num_tokens: {num_tokens!r} is invalid; "
                f"it must be an integer > 0"):
        Cross("text", num_tokens)


def test_cross_attention_names_are_unique():
    with raises("spec.cross_attention: ['text', 'text'] is invalid; "
                "it must be unique cross-attention cache names"):
        make(cross_attention=(Cross("text", 4), Cross("text", 8)))


def test_cross_attention_must_be_cross_attention_specs():
    with raises("spec.cross_attention: ('text', 4) is invalid; "
                "it must be a tuple of ARDiffusionCrossAttentionKVSpec"):
        make(cross_attention=[("text", 4)])


@pytest.mark.parametrize("value", [Cross("text", 4), None])
def test_cross_attention_must_be_a_tuple(value):
    with raises(f"spec.cross_attention: {value!r} is invalid; "
                f"it must be a tuple of ARDiffusionCrossAttentionKVSpec"):
        make(cross_attention=value)


def test_cross_attention_lengths():
    assert make().cross_attention_lengths == {}
    spec = make(cross_attention=[Cross("text", 512), Cross("image", 257)])
    assert spec.cross_attention_lengths == {"text": 512, "image": 257}
    assert list(spec.cross_attention_lengths) == ["text", "image"]  # declaration order


# ---- derived values, immutability ----------------------------------------------------------

def test_num_local_kv_branches():
    assert make().num_local_kv_branches == 1
    assert make(kv_branches=[Branch("positive", 0), Branch("negative", 1)]).num_local_kv_branches == 2


@pytest.mark.parametrize("sink, window, block, kept", [
    (0, 6, 2, 4),   # 0 + (6 - 2)
    (2, 6, 2, 6),   # 2 + (6 - 2)
    (1, 2, 2, 1),   # the window is the block: only the sink is kept
    (1, 1, 2, 1),   # a window smaller than the block keeps no past: max(0, 1 - 2) = 0
])
def test_history_frames_per_branch(sink, window, block, kept):
    spec = make(sink_frames=sink, window_frames=window, frames_per_block=block)
    assert history_frames_per_branch(spec) == kept


def test_specs_are_frozen():
    spec = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.window_frames = 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        Branch("main", 0).name = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Cross("text", 4).num_tokens = 5


def test_lists_are_stored_as_tuples_so_specs_are_hashable():
    spec = make(kv_branches=[Branch("main", 0)], cross_attention=[Cross("text", 4)])
    assert isinstance(spec.kv_branches, tuple) and isinstance(spec.cross_attention, tuple)
    same = make(kv_branches=(Branch("main", 0),), cross_attention=(Cross("text", 4),))
    assert spec == same and hash(spec) == hash(same)


def test_spec_to_dict_has_every_field():
    spec = make(cross_attention=[Cross("text", 8)])
    data = spec_to_dict(spec)
    assert set(data) == {f.name for f in dataclasses.fields(Spec)}
    assert list(data) == [f.name for f in dataclasses.fields(Spec)]  # declaration order
    assert data["kv_branches"] == [{"name": "main", "local_index": 0}]
    assert data["cross_attention"] == [{"name": "text", "num_tokens": 8}]
    assert data["window_frames"] == 5 and data["sink_frames"] == 1


# ---- runtime overrides ---------------------------------------------------------------------

def test_apply_overrides_replaces_values_including_zero():
    spec = make(window_frames=5, sink_frames=1)
    assert apply_overrides(spec) is spec
    effective = apply_overrides(spec, window_frames=9, sink_frames=0)
    assert (effective.window_frames, effective.sink_frames) == (9, 0)
    assert (spec.window_frames, spec.sink_frames) == (5, 1)


def test_apply_overrides_validates_the_result():
    with raises("spec.sink_frames: -1 is invalid; it must be an integer >= 0"):
        apply_overrides(make(), sink_frames=-1)


# ---- protocols -----------------------------------------------------------------------------

def test_missing_pipeline_methods_lists_every_missing_name_of_both_protocols():
    assert PIPELINE_METHODS == ("ar_diffusion_kv_cache_spec", "bind_ar_diffusion_state",
                                "reset_ar_diffusion_session", "close_ar_diffusion_session",
                                "generate_block")
    assert missing_pipeline_methods(GoodPipeline()) == []
    assert missing_pipeline_methods(object()) == list(PIPELINE_METHODS)
    assert missing_pipeline_methods(MissingMethodsPipeline()) == [
        "bind_ar_diffusion_state", "close_ar_diffusion_session", "generate_block"]


def test_the_protocols_are_the_upstream_ones_and_runtime_checkable():
    good = GoodPipeline()
    assert isinstance(good, SupportsARDiffusionPipeline)
    assert isinstance(good, SupportsARDiffusionBlockGeneration)
    assert not isinstance(MissingMethodsPipeline(), SupportsARDiffusionPipeline)
    assert not isinstance(good, SupportsARDiffusionWarmup)  # GoodPipeline declares no warmup
    upstream = {"ar_diffusion_kv_cache_spec": ["self"],
                "bind_ar_diffusion_state": ["self", "session_id", "state"],
                "reset_ar_diffusion_session": ["self", "session_id"],
                "close_ar_diffusion_session": ["self", "session_id"]}
    for name, params in upstream.items():
        assert list(inspect.signature(getattr(SupportsARDiffusionPipeline, name)).parameters) \
            == params
    warmup = SupportsARDiffusionWarmup.ar_diffusion_warmup_requests
    assert list(inspect.signature(warmup).parameters) == ["self", "session_id"]

"""The input declaration: its values, its checks, what the shipped pipelines declare."""

import pytest

import ardiff
from ardiff.contract.inputs import get_pipeline_inputs
from ardiff.pipelines.bouncing import BouncingWorld
from ardiff.pipelines.tiny_dit import TinyCausalDiT


def test_defaults_take_a_prompt_and_nothing_else():
    inputs = ardiff.PipelineInputs()
    assert inputs.takes("prompt") and not inputs.needs("prompt")
    assert not inputs.takes("image") and not inputs.takes("actions")


def test_required_is_taken_and_needed():
    inputs = ardiff.PipelineInputs(image="required")
    assert inputs.takes("image") and inputs.needs("image")


def test_an_unknown_use_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"PipelineInputs.actions='maybe'; expected one of "
                                         r"ignored, accepted, required"):
        ardiff.PipelineInputs(actions="maybe")  # type: ignore[arg-type]


def test_undeclared_is_none_and_a_wrong_type_is_refused():
    assert get_pipeline_inputs(object()) is None

    class Wrong:
        ardiff_inputs = {"prompt": "accepted"}

    with pytest.raises(TypeError, match="Wrong.ardiff_inputs is a dict"):
        get_pipeline_inputs(Wrong())


def test_the_shipped_pipelines_declare_what_they_read():
    assert get_pipeline_inputs(BouncingWorld()) == ardiff.PipelineInputs(
        prompt="ignored", actions="accepted")
    assert get_pipeline_inputs(TinyCausalDiT()).takes("prompt")

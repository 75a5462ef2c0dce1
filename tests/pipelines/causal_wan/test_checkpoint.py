"""Self-Forcing checkpoints: original Wan names under wrappers, converted, loaded strictly."""

from __future__ import annotations

import re

import pytest
import torch
from extras import require_extra

require_extra("wan")

from ardiff.errors import PipelineLoadError  # noqa: E402
from ardiff.pipelines.causal_wan.checkpoint import generator_state, load_strict  # noqa: E402
from ardiff.pipelines.causal_wan.make_tiny import original_name  # noqa: E402

# The original Wan2.1 T2V key names (wan/modules/model.py) and their diffusers names.
TOP = {
    "patch_embedding.weight": "patch_embedding.weight",
    "patch_embedding.bias": "patch_embedding.bias",
    "text_embedding.0.weight": "condition_embedder.text_embedder.linear_1.weight",
    "text_embedding.0.bias": "condition_embedder.text_embedder.linear_1.bias",
    "text_embedding.2.weight": "condition_embedder.text_embedder.linear_2.weight",
    "text_embedding.2.bias": "condition_embedder.text_embedder.linear_2.bias",
    "time_embedding.0.weight": "condition_embedder.time_embedder.linear_1.weight",
    "time_embedding.0.bias": "condition_embedder.time_embedder.linear_1.bias",
    "time_embedding.2.weight": "condition_embedder.time_embedder.linear_2.weight",
    "time_embedding.2.bias": "condition_embedder.time_embedder.linear_2.bias",
    "time_projection.1.weight": "condition_embedder.time_proj.weight",
    "time_projection.1.bias": "condition_embedder.time_proj.bias",
    "head.head.weight": "proj_out.weight",
    "head.head.bias": "proj_out.bias",
    "head.modulation": "scale_shift_table",
}
BLOCK = {
    **{f"{orig}_attn.{p}.{leaf}": f"attn{n}.{new}.{leaf}"
       for orig, n in (("self", 1), ("cross", 2))
       for p, new in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"))
       for leaf in ("weight", "bias")},
    **{f"{orig}_attn.{norm}.weight": f"attn{n}.{norm}.weight"
       for orig, n in (("self", 1), ("cross", 2)) for norm in ("norm_q", "norm_k")},
    "norm3.weight": "norm2.weight", "norm3.bias": "norm2.bias",  # the cross-attention norm
    "ffn.0.weight": "ffn.net.0.proj.weight", "ffn.0.bias": "ffn.net.0.proj.bias",
    "ffn.2.weight": "ffn.net.2.weight", "ffn.2.bias": "ffn.net.2.bias",
    "modulation": "scale_shift_table",
}


def original_to_diffusers(num_layers: int) -> dict[str, str]:
    names = dict(TOP)
    for layer in range(num_layers):
        names.update({f"blocks.{layer}.{o}": f"blocks.{layer}.{d}" for o, d in BLOCK.items()})
    return names


@pytest.fixture
def model(tiny_pipeline):
    import copy

    return copy.deepcopy(tiny_pipeline.transformer.model)


def wrapped(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """As Self-Forcing saves: `model.` in front, FSDP's infix at both wrapping levels."""
    return {"model._fsdp_wrapped_module." + re.sub(r"^blocks\.(\d+)\.",
                                                  r"blocks.\1._fsdp_wrapped_module.", k): v
            for k, v in state.items()}


def save(tmp_path, **entries) -> object:
    path = tmp_path / "ckpt.pt"
    torch.save(entries, path)
    return path


def test_the_original_names_map_onto_every_transformer_key(model):
    names = original_to_diffusers(len(model.blocks))
    assert sorted(names.values()) == sorted(model.state_dict())
    assert {original_name(d): o for o, d in names.items()} == {o: o for o in names}  # make_tiny


def test_a_self_forcing_checkpoint_loads_strictly(model, tmp_path):
    target = {o: torch.randn(model.state_dict()[d].shape)
              for o, d in original_to_diffusers(len(model.blocks)).items()}
    path = save(tmp_path, generator_ema=wrapped(target), generator={}, critic={"x": 1})
    load_strict(model, generator_state(path, use_ema=True), path)
    loaded = model.state_dict()
    for o, d in original_to_diffusers(len(model.blocks)).items():
        assert torch.equal(loaded[d], target[o].to(loaded[d].dtype))


def test_use_ema_picks_generator_ema_else_generator(tiny_dir):
    path = tiny_dir / "self_forcing.pt"
    ema, plain = generator_state(path, True), generator_state(path, False)
    assert ema.keys() == plain.keys()
    assert not torch.equal(ema["proj_out.weight"], plain["proj_out.weight"])


def test_the_pipeline_runs_the_checkpoint_weights_not_the_folder_s(tiny_pipeline, tiny_dir):
    expected = generator_state(tiny_dir / "self_forcing.pt", True)["blocks.0.attn1.to_q.weight"]
    assert torch.equal(tiny_pipeline.transformer.model.blocks[0].attn1.to_q.weight, expected)


def test_a_missing_generator_key_names_what_is_there(tmp_path):
    path = save(tmp_path, generator={}, critic={})
    with pytest.raises(PipelineLoadError, match=r"has no 'generator_ema' \(it holds: "
                                                r"generator, critic\); set pipeline.args.use_ema: "
                                                r"false"):
        generator_state(path, use_ema=True)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("head.head.bias"), r"missing proj_out.bias$"),
    (lambda s: s.update({"head.extra": torch.zeros(1)}), r"unexpected head.extra$"),
    (lambda s: s.update({"head.head.bias": torch.zeros(3)}),
     r"has proj_out.bias of shape \(3,\); the transformer in model_dir has \(64,\)$"),
])
def test_a_key_that_does_not_fit_is_a_one_line_error(model, tmp_path, change, message):
    state = {o: torch.zeros(model.state_dict()[d].shape)
             for o, d in original_to_diffusers(len(model.blocks)).items()}
    change(state)
    path = save(tmp_path, generator=wrapped(state))
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.generator_ckpt: .*" + message):
        load_strict(model, generator_state(path, use_ema=False), path)


def test_a_missing_checkpoint_is_named_at_load_not_at_construction(tiny_args, tmp_path):
    from ardiff.pipelines.causal_wan import CausalWan

    pipeline = CausalWan(**{**tiny_args, "generator_ckpt": str(tmp_path / "nowhere.pt")})
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.generator_ckpt: '.*nowhere.pt' "
                                                r"does not exist; give the checkpoint's path "
                                                r"\(docs/causal-wan\.md#weights\)$"):
        pipeline.load("cpu", torch.float32)


def test_a_file_that_is_not_a_checkpoint_is_a_one_line_error(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_text("not a pickle")
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.generator_ckpt: cannot read "):
        generator_state(path, use_ema=True)

"""LongLive's LoRA: merged weights give what the LoRA applied at run time gives."""

from __future__ import annotations

import pytest
import torch
from extras import require_extra

require_extra("wan")
from diffusers import WanTransformer3DModel  # noqa: E402

from ardiff.errors import PipelineLoadError  # noqa: E402
from ardiff.pipelines.causal_wan.lora import lora_state, merge_lora  # noqa: E402

LINEARS_PER_BLOCK = 10  # self q k v o, cross q k v o, ffn in, ffn out


def stock_model(tiny_dir) -> WanTransformer3DModel:
    return WanTransformer3DModel.from_pretrained(tiny_dir / "transformer",
                                                 local_files_only=True).eval()


def apply_at_run_time(model, modules, alpha: float) -> None:
    """peft's forward: y = W x + b + (alpha / rank) B (A x), as forward hooks."""
    for name, parts in modules.items():
        a, b = parts["lora_A"], parts["lora_B"]
        scale = alpha / a.shape[0]
        model.get_submodule(name).register_forward_hook(
            lambda module, args, out, a=a, b=b, scale=scale: out + scale * (args[0] @ a.T) @ b.T)


def stock_flow(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    latents, text = torch.randn((1, 16, 3, 6, 8), generator=gen), torch.randn((1, 16, 32),
                                                                              generator=gen)
    with torch.inference_mode():
        return model(latents, torch.tensor([600.0]), text, return_dict=False)[0]


@pytest.mark.parametrize("alpha", [None, 8.0])
def test_merged_equals_applied_at_run_time(tiny_dir, alpha):
    modules = lora_state(tiny_dir / "lora.pt")
    merged, hooked = stock_model(tiny_dir), stock_model(tiny_dir)
    count = merge_lora(merged, modules, alpha, tiny_dir / "lora.pt")
    apply_at_run_time(hooked, modules, alpha or 4.0)  # alpha None: alpha = rank (4)
    expected = stock_flow(hooked)
    assert count == LINEARS_PER_BLOCK * len(merged.blocks)
    assert float((stock_flow(merged) - expected).abs().max() / expected.abs().max()) <= 1e-5
    assert not torch.allclose(expected, stock_flow(stock_model(tiny_dir)))


def test_the_lora_names_become_diffusers_module_names(tiny_dir):
    names = sorted(lora_state(tiny_dir / "lora.pt"))
    assert names[:3] == ["blocks.0.attn1.to_k", "blocks.0.attn1.to_out.0", "blocks.0.attn1.to_q"]
    assert "blocks.1.ffn.net.0.proj" in names and "blocks.1.ffn.net.2" in names


def test_a_lora_with_half_a_module_is_a_one_line_error(tmp_path):
    path = tmp_path / "lora.pt"
    torch.save({"generator_lora": {
        "base_model.model.blocks.0.self_attn.q.lora_A.weight": torch.zeros(4, 32)}}, path)
    with pytest.raises(PipelineLoadError, match=r"has only lora_A for blocks.0.attn1.to_q; each "
                                                r"module needs both lora_A and lora_B$"):
        lora_state(path)


def test_a_lora_for_a_module_the_model_lacks_is_a_one_line_error(tiny_dir, tmp_path):
    path = tmp_path / "lora.pt"
    torch.save({"generator_lora": {
        "base_model.model.blocks.9.self_attn.q.lora_A.weight": torch.zeros(4, 32),
        "base_model.model.blocks.9.self_attn.q.lora_B.weight": torch.zeros(32, 4)}}, path)
    with pytest.raises(PipelineLoadError, match=r"adapts blocks.9.attn1.to_q, which the "
                                                r"transformer does not have$"):
        merge_lora(stock_model(tiny_dir), lora_state(path), None, path)


def test_the_longlive_preset_loads_with_its_lora(tiny_args, tiny_dir):
    from ardiff.pipelines.causal_wan import CausalWan
    from ardiff.pipelines.causal_wan.checkpoint import generator_state

    args = {k: v for k, v in tiny_args.items() if k not in ("window_frames", "sink_frames")}
    pipeline = CausalWan(**args, preset="longlive", lora_ckpt=str(tiny_dir / "lora.pt"))
    spec = pipeline.ar_diffusion_kv_cache_spec()
    assert (spec.window_frames, spec.sink_frames) == (9, 3)
    pipeline.load("cpu", torch.float32)
    base = generator_state(tiny_dir / "self_forcing.pt", use_ema=False)  # longlive: generator
    lora = lora_state(tiny_dir / "lora.pt")["blocks.0.attn1.to_q"]
    expected = base["blocks.0.attn1.to_q.weight"] + lora["lora_B"] @ lora["lora_A"]
    assert torch.allclose(pipeline.transformer.model.blocks[0].attn1.to_q.weight, expected,
                          atol=1e-6)

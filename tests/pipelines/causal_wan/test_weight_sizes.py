"""The weights' bytes counted from the configs (weight_sizes.py, #24) equal the modules'
parameter bytes: on the tiny model after `load` (float32 and bfloat16, where diffusers keeps
some modules in float32), and on Wan2.1-1.3B's real shapes built on the meta device."""

from __future__ import annotations

from extras import require_extra

require_extra("wan")

import torch  # noqa: E402

from ardiff.pipelines.causal_wan import CausalWan  # noqa: E402
from ardiff.pipelines.causal_wan.make_tiny import (  # noqa: E402
    UMT5_XXL,
    WAN_13B_TRANSFORMER,
    WAN_VAE,
)
from ardiff.pipelines.causal_wan.weight_sizes import (  # noqa: E402
    text_encoder_params,
    transformer_params,
    vae_params,
)


def parameter_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def loaded_bytes(pipeline) -> dict[str, int]:
    return {"transformer": parameter_bytes(pipeline.transformer.model),
            "text_encoder": parameter_bytes(pipeline.prompt_encoder.encoder),
            "vae": parameter_bytes(pipeline.decoder.vae)}


def test_the_count_is_the_loaded_float32_model(tiny_pipeline):
    assert tiny_pipeline.weight_bytes("float32") == loaded_bytes(tiny_pipeline)


def test_the_count_is_the_loaded_bfloat16_model_with_its_float32_modules(tiny_args):
    pipeline = CausalWan(**{**tiny_args, "vae_dtype": "bfloat16"})
    counted = pipeline.weight_bytes("bfloat16")   # before load: configs only
    pipeline.load("cpu", torch.bfloat16)
    assert counted == loaded_bytes(pipeline)
    kept = {p.dtype for n, p in pipeline.transformer.model.named_parameters()
            if "time_embedder" in n}
    assert kept == {torch.float32}  # what makes the count more than params x 2


def test_the_count_matches_wan_13b_and_umt5_xxl_built_without_weights():
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    with torch.device("meta"):
        transformer = WanTransformer3DModel(**WAN_13B_TRANSFORMER)
        vae = AutoencoderKLWan(**WAN_VAE)
        encoder = UMT5EncoderModel(UMT5Config(**UMT5_XXL))
    assert sum(transformer_params(WAN_13B_TRANSFORMER)) == sum(
        p.numel() for p in transformer.parameters())               # 1,418,996,800
    assert vae_params(WAN_VAE) == sum(p.numel() for p in vae.parameters())   # 126,892,531
    cast, kept = text_encoder_params(UMT5_XXL, "float16")
    assert kept > 0 and cast + kept == sum(p.numel() for p in encoder.parameters())  # 5.68e9


def test_wans_own_layout_counts_the_same(tiny_args, tmp_path):
    """Wan's layout has no text_encoder/config.json: UMT5's shapes come from its `.pth`."""
    from ardiff.pipelines.causal_wan.make_tiny import write_model

    write_model(tmp_path / "wan", layout="wan")
    wan = CausalWan(**{**tiny_args, "model_dir": str(tmp_path / "wan")})
    assert wan.model_layout == "wan"
    assert wan.weight_bytes("bfloat16") == CausalWan(**tiny_args).weight_bytes("bfloat16")

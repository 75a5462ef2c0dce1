"""The released checkpoints and configs: the files each research repo ships, read as shipped."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from extras import require_extra

from ardiff.pipelines.causal_wan import CausalWan
from ardiff.pipelines.causal_wan.make_tiny import SHAPES, write_configs

CONFIGS = Path(__file__).parents[3] / "configs"

# What each release ships (paths inside its Hub repository, as its README and inference code
# read them) and the preset that runs it: docs/causal-wan.md#releases gives the downloads.
RELEASES = {
    "self-forcing.yaml": ("self-forcing", "checkpoints/self_forcing_dmd.pt", None),
    "causvid.yaml": ("causvid", "autoregressive_checkpoint/model.pt", None),
    "longlive.yaml": ("longlive", "longlive_models/models/longlive_base.pt",
                      "longlive_models/models/lora.pt"),
}


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_each_release_config_names_the_files_its_repo_ships(name):
    preset, generator, lora = RELEASES[name]
    args = yaml.safe_load((CONFIGS / name).read_text())["pipeline"]["args"]
    assert (args["preset"], args["generator_ckpt"], args.get("lora_ckpt")) == (preset, generator,
                                                                               lora)


def test_causvid_s_warped_4_step_config_is_expressible(tmp_path):
    """wan_causal_dmd_warp_4step_cfg2.yaml: 1000 750 500 250, warp_denoising_step, shift 8."""
    write_configs(tmp_path, *SHAPES["tiny"])
    config = CausalWan(model_dir=str(tmp_path), preset="causvid", warp=True,
                       denoising_steps=[1000, 750, 500, 250]).config
    assert config.timesteps() == pytest.approx([1000.0, 960.0, 888.8889, 727.2728], abs=1e-3)
    released = CausalWan(model_dir=str(tmp_path), preset="causvid").config
    assert released.timesteps() == [1000.0, 757.0, 522.0] and not released.use_ema


def causvid_checkpoint(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """As CausVid's train_distillation.py saves it: FSDP's FULL_STATE_DICT of the generator
    wrapper (so `model.` in front of the original Wan names, no FSDP infix), beside the
    critic's; its inference loads `['generator']` into that wrapper, strictly."""
    from ardiff.pipelines.causal_wan.make_tiny import original_name

    return {"generator": {"model." + original_name(k): v for k, v in state.items()},
            "critic": {"model.head.head.bias": torch.zeros(3)}}


def test_causvid_s_released_file_loads_without_conversion(tiny_pipeline, tiny_args, tmp_path):
    require_extra("wan")
    from ardiff.pipelines.causal_wan.checkpoint import generator_state, load_strict

    model = copy.deepcopy(tiny_pipeline.transformer.model)
    target = {k: torch.randn(v.shape) for k, v in model.state_dict().items()}
    path = tmp_path / "autoregressive_checkpoint" / "model.pt"
    path.parent.mkdir()
    torch.save(causvid_checkpoint(target), path)
    use_ema = CausalWan(**{**tiny_args, "preset": "causvid"}).config.use_ema
    load_strict(model, generator_state(path, use_ema), path)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], target[k].to(loaded[k].dtype)) for k in target)

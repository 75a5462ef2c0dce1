"""causal-Wan declares what it reads (its model folder, checkpoint and LoRA), so that no output
of a run can be one of them: construction reads only the two config.json files."""

from __future__ import annotations

from ardiff.engine.loader import declared_input_paths
from ardiff.pipelines.causal_wan import CausalWan
from ardiff.pipelines.causal_wan.make_tiny import SHAPES, write_configs


def test_the_model_folder_checkpoint_and_lora_are_declared(tmp_path):
    write_configs(tmp_path / "wan", *SHAPES["tiny"])
    plain = CausalWan(model_dir=str(tmp_path / "wan"), height=48, width=64)
    assert declared_input_paths(plain) == [("pipeline.args.model_dir", tmp_path / "wan")]

    tuned = CausalWan(model_dir=str(tmp_path / "wan"), height=48, width=64,
                      generator_ckpt=str(tmp_path / "sf.pt"), lora_ckpt=str(tmp_path / "lora.pt"))
    assert declared_input_paths(tuned) == [("pipeline.args.model_dir", tmp_path / "wan"),
                                           ("pipeline.args.generator_ckpt", tmp_path / "sf.pt"),
                                           ("pipeline.args.lora_ckpt", tmp_path / "lora.pt")]

"""Wan's own T5 file onto transformers' UMT5EncoderModel (umt5.py): the key map is a
bijection, a model written in Wan's names loads back to the same outputs, and (with Wan's
source, ARDIFF_WAN_SRC=<a checkout of Wan-Video/Wan2.1>) it equals Wan's own T5Encoder."""

from __future__ import annotations

import pytest
import torch
from extras import require_extra

require_extra("wan")

from transformers import UMT5Config, UMT5EncoderModel  # noqa: E402
from wan_source import wan_module  # noqa: E402

from ardiff.errors import PipelineLoadError  # noqa: E402
from ardiff.pipelines.causal_wan.make_tiny import TINY_UMT5  # noqa: E402
from ardiff.pipelines.causal_wan.umt5 import (  # noqa: E402
    TIED_KEY,
    load_wan_t5,
    umt5_config,
    umt5_name,
    wan_name,
    wan_state,
)

VOCAB, WIDTH = 97, 32
LENGTH = 160  # past Wan's 128-token relative-position range: the log-spaced buckets are used


def tiny_umt5(seed: int = 0):
    config = UMT5Config(vocab_size=VOCAB, d_model=WIDTH, **TINY_UMT5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return UMT5EncoderModel(config).eval()


def ids_and_mask(length: int = LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, length), generator=generator)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length // 3:] = 0  # the second prompt padded: masked keys
    return ids, mask


def test_the_key_map_is_a_bijection_over_umt5s_state_dict():
    model = tiny_umt5()
    keys = set(model.state_dict())
    mapped = {k: wan_name(k) for k in keys - {TIED_KEY}}
    assert None not in mapped.values()
    assert len(set(mapped.values())) == len(mapped)                # one Wan key per UMT5 key
    assert {umt5_name(w) for w in mapped.values()} == keys - {TIED_KEY}  # and back
    assert wan_name(TIED_KEY) is None and model.encoder.embed_tokens.weight is model.shared.weight
    assert umt5_name("blocks.0.attn.q.bias") is None and umt5_name("head.weight") is None


def test_a_model_written_in_wans_names_loads_to_the_same_encoder(tmp_path):
    model = tiny_umt5()
    path = tmp_path / "t5.pth"
    torch.save(wan_state(model.state_dict()), path)
    loaded = load_wan_t5(path, torch.float32).eval()
    assert loaded.encoder.embed_tokens.weight is loaded.shared.weight
    config = loaded.config
    assert (config.d_kv, config.d_ff, config.num_heads, config.num_layers) == (8, 64, 4, 2)
    assert config.relative_attention_max_distance == 128
    ids, mask = ids_and_mask()
    with torch.no_grad():
        expected = model(ids, mask).last_hidden_state
        assert torch.equal(loaded(ids, mask).last_hidden_state, expected)


def test_a_file_that_is_not_wans_t5_is_one_line(tmp_path):
    state = wan_state(tiny_umt5().state_dict())
    path = tmp_path / "t5.pth"
    torch.save({**state, "head.weight": torch.zeros(1)}, path)
    with pytest.raises(PipelineLoadError, match=r"^pipeline.args.model_dir: '.*t5.pth' has "
                                                r"'head.weight' \(1 keys in all\) that Wan's "
                                                r"UMT5 encoder does not"):
        load_wan_t5(path, torch.float32)
    del state["blocks.0.ffn.fc1.weight"]
    with pytest.raises(PipelineLoadError, match=r"has no 'blocks.0.ffn.fc1.weight'; is it "):
        umt5_config(state, path)


# -- against Wan's own code ------------------------------------------------------------------

@pytest.fixture
def wan_t5(monkeypatch):
    """Wan's wan/modules/t5.py from ARDIFF_WAN_SRC (wan_source.py), or a skip."""
    return wan_module("t5", monkeypatch)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_the_key_map_equals_wans_own_t5(wan_t5, tmp_path, dtype, tolerance):
    """Wan's T5Encoder (umt5-xxl's structure at a tiny size: per-layer relative positions,
    gated GELU-tanh, 32 buckets) against UMT5EncoderModel loaded from its state dict."""
    torch.manual_seed(0)
    wan = wan_t5.T5Encoder(vocab=VOCAB, dim=WIDTH, dim_attn=WIDTH, dim_ffn=64, num_heads=4,
                           num_layers=2, num_buckets=32, shared_pos=False, dropout=0.0).eval()
    path = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save(wan.to(dtype).state_dict(), path)
    ours = load_wan_t5(path, dtype).eval()
    ids, mask = ids_and_mask()
    with torch.no_grad():
        expected = wan(ids, mask).float()
        got = ours(ids, mask).last_hidden_state.float()
    difference = (got - expected).abs().max().item()
    print(f"max |UMT5EncoderModel - Wan's T5Encoder| in {dtype}: {difference:.3g} "
          f"(outputs up to {expected.abs().max().item():.3g})")
    assert difference <= tolerance * expected.abs().max().item()

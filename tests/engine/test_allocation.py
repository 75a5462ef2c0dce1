"""A budget the device cannot really provide fails with exit 3 at allocation, not a traceback."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from ardiff_cli.main import app

# 46 TiB of KV for one session: the plan accepts it under a 1 PB budget, the allocator cannot.
HUGE = {"pipeline": {"entry": "ardiff.pipelines.synthetic:SyntheticAttention",
                     "args": {"num_layers": 64, "num_kv_heads": 64, "head_size": 256,
                              "tokens_per_frame": 100000, "frames_per_block": 3,
                              "window_frames": 60, "session_capacity": 1}},
        "runtime": {"memory_budget": 10**15}}


def test_an_allocation_the_machine_refuses_is_a_capacity_error(tmp_path):
    config = tmp_path / "huge.yaml"
    config.write_text(yaml.safe_dump(HUGE))
    result = CliRunner().invoke(app, ["warmup", str(config)])
    assert result.exit_code == 3
    assert ("error: runtime.memory_budget: allocating the KV cache (46TiB for 1 session(s)) on "
            "cpu failed") in result.stderr
    assert "lower runtime.memory_budget" in result.stderr

"""`ardiff bench --preview --plot`: the preview's cost measured beside the progress bar, and
a picture of one rollout."""

from __future__ import annotations

import json

import yaml
from extras import require_extra
from PIL import Image
from typer.testing import CliRunner

from ardiff_cli.main import app

TINY = {"pipeline": {"entry": "ardiff.pipelines.synthetic:SyntheticAttention",
                     "args": {"num_layers": 1, "num_kv_heads": 1, "head_size": 8,
                              "tokens_per_frame": 4, "frames_per_block": 2, "window_frames": 4,
                              "sink_frames": 1}},
        "runtime": {"memory_budget": "16MiB"}, "rollout": {"frames": 8},
        "output": {"fps": 1000, "path": "unused.npy"}}


def test_bench_measures_the_preview_and_draws_the_plot(tmp_path, monkeypatch):
    require_extra("plot")
    monkeypatch.setattr("ardiff_cli.bench.startup_seconds", lambda args: {"wall": [0.1], "cpu": [0.1]})
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump(TINY))
    plot = tmp_path / "bench.png"
    result = CliRunner().invoke(app, ["bench", str(config), "--blocks", "1", "--repeats", "2",
                                      "--no-encode", "--no-compile", "--preview", "--plot", str(plot),
                                      "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    numbers = data["preview"]
    assert numbers["with_s"] > 0 and numbers["without_s"] > 0 and numbers["target"] == 0.05
    assert numbers["frames_drawn"] >= 2    # at 1000 fps every block of both repeats is drawn
    assert numbers["callback_s"]["with"] > 0
    assert data["plot"] == {"path": str(plot), "error": None}
    with Image.open(plot) as image:
        image.verify()
    assert not (tmp_path / "unused.npy").exists()   # the bench's rollouts write elsewhere


def test_a_bad_plot_path_is_refused_before_the_bench_runs(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump(TINY))
    result = CliRunner().invoke(app, ["bench", str(config), "--plot", str(tmp_path / "b.gif")])
    assert result.exit_code == 2
    assert "--plot: " in result.output and "has no picture suffix" in result.output

"""Fixtures of the Matrix-Game tests: one tiny random folder in the released layout per test
session (the `make_tiny` tool, no hub access) and a test image."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def mg_dir(tmp_path_factory) -> Path:
    from ardiff.pipelines.matrix_game.make_tiny import write

    out = tmp_path_factory.mktemp("models") / "matrix-game-tiny"  # the tiny config's name
    out.mkdir()
    write(out, "tiny", None, 0, False)
    return out


@pytest.fixture(scope="session")
def image_path(tmp_path_factory) -> Path:
    """A 300 x 500 picture with structure (gradients and a square), as a PNG."""
    from PIL import Image

    y, x = torch.meshgrid(torch.arange(300), torch.arange(500), indexing="ij")
    pixels = torch.stack([x * 255 // 499, y * 255 // 299, (x + y) % 256], dim=-1)
    pixels[100:200, 200:300] = torch.tensor([255, 32, 32])
    path = tmp_path_factory.mktemp("images") / "start.png"
    Image.fromarray(pixels.to(torch.uint8).numpy()).save(path)
    return path

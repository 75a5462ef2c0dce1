"""Matrix-Game 2.0 (SkyworkAI): an interactive world model from a first image, steered by
keyboard and mouse, from the released files (docs/matrix-game.md)."""

from ardiff.pipelines.matrix_game.pipeline import MatrixGame

__all__ = ["MatrixGame"]

"""ardiff.video."""

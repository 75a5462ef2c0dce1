"""ardiff.engine."""

"""ardiff.config."""

"""ardiff.rollout."""

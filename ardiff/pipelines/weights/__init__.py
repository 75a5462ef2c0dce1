"""Trained weights that ship with ardiff (made by examples/train_world.py)."""

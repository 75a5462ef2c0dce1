"""Trained weights that ship with ardiff (made by `python -m ardiff.pipelines.bouncing.train`)."""

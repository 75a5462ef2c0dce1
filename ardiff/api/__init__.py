"""The Python API: a run opened from a config, its frames in memory (docs/python.md).

    with ardiff.open("configs/tiny-dit.yaml", rollout={"seed": 3}) as run:
        for block in run.blocks(frames=24, prompt="a red ball"):
            block.frames                       # numpy uint8 [F, H, W, 3]
        with run.session() as session:         # steered block by block
            block = session.step(action="left")
"""

from ardiff.api.run import Run, open_run
from ardiff.api.session import Block, Session

__all__ = ["Block", "Run", "Session", "open_run"]

"""`python -m ardiff.pipelines.bouncing.train`: train the shipped weights (`training/stages.py`).

    python -m ardiff.pipelines.bouncing.train                 # both stages, evaluate, ship
    python -m ardiff.pipelines.bouncing.train --stage base    # teacher forcing only
    python -m ardiff.pipelines.bouncing.train --stage rollout --init world-ckpt/base.safetensors
"""

import os

if __name__ == "__main__":
    # OpenMP threads sleep instead of spinning in barriers: on a CPU shared with other work,
    # spinning threads stall each other. Set before torch loads OpenMP, which is why neither
    # this module nor the package imports torch before this line.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from ardiff.pipelines.bouncing.training.stages import main

    main()

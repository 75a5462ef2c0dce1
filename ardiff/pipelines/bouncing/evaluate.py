"""`python -m ardiff.pipelines.bouncing.evaluate`: the world model's numbers (`training/evaluate.py`).

    python -m ardiff.pipelines.bouncing.evaluate              # the weights shipped with ardiff
    python -m ardiff.pipelines.bouncing.evaluate --weights world-ckpt/base.safetensors --json m.json
    python -m ardiff.pipelines.bouncing.evaluate --num-steps 1          # one denoising step
"""

if __name__ == "__main__":
    from ardiff.pipelines.bouncing.training.evaluate import main

    main()

"""What only trains and measures the bouncing world model; the runtime never imports it.

    stages.py    the two training stages and shipping (`python -m ardiff.pipelines.bouncing.train`)
    losses.py    stage 1's objective;  drift.py  stage 2's (the remedies against drift)
    evaluate.py  held-out numbers through ardiff's runner (`python -m ...bouncing.evaluate`)
    locator.py   finds the balls and the sprite in frames again, by colour
    games.py     how long the steered sprite lasts in played games (`python -m ...training.games`)
"""

"""What the shipped pipelines share: model parts (`nn`), seeded noise and the flow-matching
sampler (`sampling`), and the contiguous K/V ring of the hand-written reference loops
(`ring`). Internal to ardiff's pipelines, not public API."""

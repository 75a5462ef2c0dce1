"""matrix-game's `generate_blocks`: rows of different sessions (each its own image, actions,
noise; ragged positions, one past window eviction) in one forward per step equal each
session run alone: latents within 1e-5 relative, frames within 2 levels (the batched VAE
decode may round differently; docs/matrix-game.md)."""

from __future__ import annotations

import pytest

from tests.support.matrix_game import make_pipeline, make_runner

pytestmark = [pytest.mark.extra("wan"), pytest.mark.heavy]  # 18 blocks: .ci/run's heavy step
SESSIONS = {"a": (["w", "w+l", "a+i", "idle"], 1), "b": (["d", "s+j", "w"], 2),
            "c": (["i", "w+a"], 3)}


def request(session, block, images):
    from ardiff import RolloutRequest

    actions, seed = SESSIONS[session]
    return RolloutRequest(session, block_index=block, seed=seed, actions=(actions[block],),
                          extra={"image": images[session]})


def test_batched_rows_equal_each_session_alone(mg_dir, image_path, tmp_path):
    from PIL import Image

    gray = tmp_path / "gray.png"
    Image.new("RGB", (80, 40), (30, 120, 200)).save(gray)
    images = {"a": image_path, "b": gray, "c": image_path}
    pipeline = make_pipeline(mg_dir)
    alone = {}
    with make_runner(pipeline) as runner:
        for session, (actions, _) in SESSIONS.items():
            alone[session] = [runner.execute(request(session, b, images)).output
                              for b in range(len(actions))]
    # a starts first; b joins at a's block 2 (a past eviction: window 6), c at a's block 3
    schedule = [[("a", 0)], [("a", 1)], [("a", 2), ("b", 0)], [("a", 3), ("b", 1), ("c", 0)],
                [("b", 2), ("c", 1)]]
    with make_runner(pipeline, batch_rows=3) as runner:
        for step in schedule:
            results = runner.execute_batch([request(s, b, images) for s, b in step])
            for (session, block), result in zip(step, results):
                mine, reference = result.output, alone[session][block]
                latents, expected = mine.extra["latents"], reference.extra["latents"]
                error = float((latents - expected).abs().max() / expected.abs().max())
                assert error <= 1e-5, (session, block, error)
                frames = (mine.frames.int() - reference.frames.int()).abs().max()
                assert int(frames) <= 2, (session, block, int(frames))

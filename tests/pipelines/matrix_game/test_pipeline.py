"""matrix-game on the tiny random folder: blocks, actions, images, sessions, the window, and
`ardiff rollout --image --actions` end to end."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from tests.support.matrix_game import CHECKPOINTS, SMALL, make_pipeline, make_runner

pytestmark = pytest.mark.extra("wan")
TINY_CONFIG = Path(__file__).parents[3] / "configs" / "matrix-game-tiny.yaml"
SPACES_NAMES = ("idle", "w", "w+l", "l")  # what the game below may log


@pytest.fixture(scope="module")
def universal(mg_dir):
    return make_pipeline(mg_dir, "universal")


def run(pipeline, image, actions, session="s", seed=0):
    from ardiff import RolloutRequest

    with make_runner(pipeline) as runner:
        return [runner.execute(RolloutRequest(session, block_index=b, seed=seed,
                                              actions=action, extra={"image": image})).output
                for b, action in enumerate(actions)]


def test_blocks_give_9_then_12_frames_and_the_session_state_is_dropped(universal, image_path):
    outputs = run(universal, image_path, [("w",), ("w+l",), ("idle",)])
    assert [o.frames.shape for o in outputs] == [(9, 32, 64, 3), (12, 32, 64, 3),
                                                 (12, 32, 64, 3)]
    assert outputs[0].extra["latents"].shape == (1, 16, 3, 4, 8)
    assert universal.sessions == {}  # the runner closed the session: its state is gone


def test_actions_steer_the_video(universal, image_path):
    forward = run(universal, image_path, [("w",), ("w",)])
    turning = run(universal, image_path, [("w",), ("d+j",)])
    same = run(universal, image_path, [("w",), ("w",)])
    assert torch.equal(forward[0].frames, turning[0].frames)  # block 0: the same action
    assert not torch.equal(forward[1].extra["latents"], turning[1].extra["latents"])
    assert torch.equal(forward[1].extra["latents"], same[1].extra["latents"])


def test_one_action_per_latent_frame_equals_the_same_action_per_block(universal, image_path):
    per_block = run(universal, image_path, [("a",), ("w+i",)])
    per_frame = run(universal, image_path, [("a", "a", "a"), ("w+i",) * 3])
    assert torch.equal(per_block[1].extra["latents"], per_frame[1].extra["latents"])


def test_the_image_sets_the_video(universal, image_path, tmp_path):
    from PIL import Image

    other = tmp_path / "gray.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(other)
    first = run(universal, image_path, [("w",)])
    second = run(universal, other, [("w",)])
    assert not torch.equal(first[0].frames, second[0].frames)


def test_a_session_without_an_image_is_refused(universal):
    from ardiff import RolloutRequest
    from ardiff.errors import ConfigError, PipelineError

    with make_runner(universal) as runner:
        with pytest.raises((ConfigError, PipelineError), match="starts without an image"):
            runner.execute(RolloutRequest("s", block_index=0))


def test_unknown_actions_are_named(universal):
    from ardiff.errors import ConfigError
    from ardiff.pipelines.matrix_game.actions import SPACES

    with pytest.raises(ConfigError, match=r"'w\+x' is not an action of Matrix-Game 'universal'"):
        SPACES["universal"].vectors("w+x")
    with pytest.raises(ConfigError, match="is not an action"):
        SPACES["templerun"].vectors("w+a")  # one-hot: one key
    assert "i+j" in SPACES["universal"].names and "i+k" not in SPACES["universal"].names
    assert SPACES["templerun"].names[0] == "nomove"
    assert SPACES["universal"].vectors("w+l") == ([1.0, 0.0, 0.0, 0.0], [0.0, 0.1])
    assert SPACES["gta_drive"].vectors("s+a") == ([0.0, 1.0], [0.0, -0.1])


@pytest.mark.parametrize("mode", list(CHECKPOINTS))
def test_each_checkpoint_runs_with_its_own_window(mg_dir, image_path, mode):
    pipeline = make_pipeline(mg_dir, mode)
    spec = pipeline.ar_diffusion_kv_cache_spec()
    assert (spec.window_frames, spec.sink_frames) == ({"gta_drive": 4}.get(mode, 6), 0)
    assert spec.cross_attention[0].num_tokens == 257
    idle = pipeline.config.space.idle
    outputs = run(pipeline, image_path, [(idle,)] * 3)
    assert sum(o.frames.shape[0] for o in outputs) == 33


def test_a_window_override_is_refused(mg_dir, image_path):
    from ardiff import RolloutRequest
    from ardiff.engine.runner import Runner
    from ardiff.errors import ConfigError, PipelineError
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan

    pipeline = make_pipeline(mg_dir)
    spec = pipeline.ar_diffusion_kv_cache_spec()
    plan = make_plan(dataclasses.replace(spec, window_frames=3), "float32", 2, 1 << 30)
    runner = Runner(pipeline, create_cache(plan, "paged", "cpu"), "cpu")
    with pytest.raises((ConfigError, PipelineError), match="leave runtime.kv.window_frames"):
        for block in range(3):
            runner.execute(RolloutRequest("s", block_index=block, extra={"image": image_path}))
    runner.close()


def test_the_spec_counts_the_action_caches_and_weights_match_the_modules(universal):
    from ardiff.pipelines.matrix_game.spec import action_state_bytes

    c = universal.config
    assert action_state_bytes(c) == 1 * (2 * 3 * 128 + 2 * 3 * 8 * 128) * 4  # layer 0 only
    sizes = universal.weight_bytes("float32")
    t = universal.transformer
    loaded = sum(p.numel() * p.element_size() for m in (t.model, t.img_emb, *t.actions.values())
                 for p in m.parameters())
    assert sizes["transformer"] == loaded
    assert sizes["image_encoder"] == sum(p.numel() * 4 for p in universal.clip.parameters())
    assert sizes["vae"] == sum(p.numel() * 4 for p in universal.vae.parameters())


@pytest.mark.heavy  # end to end: warmup and a 45-frame rollout (.ci/run runs the config too)
def test_rollout_with_an_image_and_actions_writes_the_video(mg_dir, image_path, ardiff_main,
                                                           monkeypatch, tmp_path):
    import av

    monkeypatch.chdir(mg_dir.parent)
    actions = tmp_path / "actions.yaml"
    actions.write_text("- w\n- [w+l, w, w+i]\n- idle\n")
    out = tmp_path / "x.mp4"
    result = ardiff_main("rollout", TINY_CONFIG, "--image", image_path, "--actions", actions,
                         "-o", out, "--quiet", "--set", f"pipeline.args.height={SMALL['height']}",
                         "--set", f"pipeline.args.width={SMALL['width']}")
    assert result.exit_code == 0, result.output
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 45


@pytest.mark.parametrize("args, message", [
    ([], "starts each video from an image; give --image PATH"),
    (["--image", "missing.png"], "'.*missing.png' is not a file"),
    (["--image", "{text}"], "is not an image Pillow can read"),
    (["--image", "{empty}"], "is not an image Pillow can read"),
])
def test_bad_images_are_one_line_errors_before_any_work(mg_dir, ardiff_main, monkeypatch,
                                                        tmp_path, args, message):
    monkeypatch.chdir(mg_dir.parent)
    (tmp_path / "t.txt").write_text("not a picture")
    (tmp_path / "e.png").write_bytes(b"")
    args = [a.format(text=tmp_path / "t.txt", empty=tmp_path / "e.png") for a in args]
    out = tmp_path / "x.mp4"
    result = ardiff_main("rollout", TINY_CONFIG, *args, "-o", out, "--quiet")
    assert result.exit_code == 2, result.output
    assert re.search(message, result.output), result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_an_image_for_a_pipeline_that_takes_none_is_refused(ardiff_main, tmp_path, image_path):
    out = tmp_path / "x.mp4"
    result = ardiff_main("rollout", "--image", image_path, "-o", out, "--quiet")
    assert result.exit_code == 2, result.output
    assert "takes no image" in result.output and not out.exists()


@pytest.mark.heavy  # a game in a pseudo-terminal: the tiny model from an image, keys as chords
def test_play_steers_it_with_chords_and_logs_a_replay_with_the_image(mg_dir, image_path,
                                                                      tmp_path):
    import yaml
    from pty_driver import Keys, Wait, run_in_pty

    game = run_in_pty(["play", TINY_CONFIG, "--image", image_path, "-o", tmp_path / "g.npy",
                       "--frames", "45", "--set", f"pipeline.args.model_dir={mg_dir}", "--set",
                       "warmup.enabled=false"],
                      [Wait("frame "), Keys(b"w\x1b[C", 2.0), Keys(b"q", 0.5)],
                      cwd=tmp_path, timeout_s=600)
    assert game.exit_code == 0, game.output
    assert "w w" in game.output and "l/→ l" in game.output  # the keys printed at start
    log = (tmp_path / "g.actions.yaml").read_text()
    assert f"--image {image_path}" in log  # the replay starts from the same image
    assert set(yaml.safe_load(log)["actions"]) <= set(SPACES_NAMES)

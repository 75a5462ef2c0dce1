"""A rollout's first images: which video gets which, and the checks against the pipeline's
inputs, before any work (ardiff.rollout.images, ardiff.image)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import ardiff
from ardiff.config.run import load_config
from ardiff.errors import ConfigError
from ardiff.image import MAX_IMAGE_PIXELS, open_image
from ardiff.rollout.images import check_images, stream_images


def config(tmp_path: Path, rollout: str):
    path = tmp_path / "run.yaml"
    path.write_text(f"pipeline: {{entry: tiny-dit}}\nrollout: {rollout}\n")
    return load_config(path)


def plan(*images):
    return SimpleNamespace(streams=[SimpleNamespace(image=image) for image in images])


class Takes:
    def __init__(self, use: str) -> None:
        self.ardiff_inputs = ardiff.PipelineInputs(image=use)


def test_one_image_for_every_video_or_one_per_video(tmp_path):
    assert stream_images(config(tmp_path, "{image: a.png}"), 2) == [tmp_path / "a.png"] * 2
    assert stream_images(config(tmp_path, "{images: [a.png, /b.png]}"), 2) == [
        tmp_path / "a.png", Path("/b.png")]
    assert stream_images(config(tmp_path, "{}"), 1) == [None]


@pytest.mark.parametrize("rollout, streams, message", [
    ("{image: a.png, images: [b.png]}", 1, "rollout.image and rollout.images are both set"),
    ("{images: [a.png, b.png]}", 3, "rollout.images: 2 images for 3 videos (prompts)"),
    ("{images: []}", 1, "rollout.images: the list is empty"),
])
def test_image_lists_that_do_not_fit_are_refused(tmp_path, rollout, streams, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stream_images(config(tmp_path, rollout), streams)


def test_images_are_held_to_the_pipeline_s_inputs(tmp_path, image_file):
    check_images(plan(image_file), Takes("required"), "x")
    check_images(plan(None), SimpleNamespace(), "x")  # declares nothing: nothing checked
    with pytest.raises(ConfigError, match="pipeline 'x' starts each video from an image"):
        check_images(plan(image_file, None), Takes("required"), "x")
    with pytest.raises(ConfigError, match="pipeline 'x' takes no image"):
        check_images(plan(image_file), Takes("ignored"), "x")
    with pytest.raises(ConfigError, match="is not a file"):
        check_images(plan(tmp_path / "nope.png"), Takes("accepted"), "x")


@pytest.fixture
def image_file(tmp_path):
    from PIL import Image

    path = tmp_path / "start.png"
    Image.new("RGB", (20, 10), (1, 2, 3)).save(path)
    return path


def test_open_image_refuses_what_is_no_image_or_too_big(tmp_path, image_file, monkeypatch):
    assert open_image(image_file, "f").size == (20, 10)
    assert open_image(image_file.read_bytes(), "f").mode == "RGB"
    (tmp_path / "t.txt").write_text("text")
    with pytest.raises(ConfigError, match=r"f: '.*t.txt' is not an image Pillow can read"):
        open_image(tmp_path / "t.txt", "f")
    with pytest.raises(ConfigError, match="the uploaded file is not an image"):
        open_image(b"", "f")
    monkeypatch.setattr("ardiff.image.MAX_IMAGE_BYTES", 10)
    with pytest.raises(ConfigError, match="over the limit of 10; give a smaller image"):
        open_image(image_file, "f")
    monkeypatch.undo()
    monkeypatch.setattr("ardiff.image.MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ConfigError, match="is 20x10 pixels, over the limit of 100"):
        open_image(image_file, "f")
    assert MAX_IMAGE_PIXELS == 8192 * 8192

"""Every number of a run config is bounded and finite, and every string is valid text, so what
passes validation does not fail after the compute (docs/configs.md#bounds lists the bounds)."""

from __future__ import annotations

import math
import re

import av
import numpy as np
import pytest
import torch
from PIL import Image

from ardiff.config.run import build_config
from ardiff.contract.spec import DEFAULT_MAX_MODEL_LEN
from ardiff.errors import ConfigError
from ardiff.limits import (
    MAX_CRF,
    MAX_FPS,
    MAX_FRAMES,
    MAX_NUM_STEPS,
    MAX_PAGE_TOKENS,
    MAX_SCALE,
    MAX_SEED,
    MAX_SESSIONS,
    MIN_FPS,
)
from ardiff.pipelines.shared.sampling import SEED_STRIDE, block_generator

MINIMAL = {"pipeline": {"entry": "pkg.mod:Pipe"}}


def build(section: str, values: dict):
    return build_config({**MINIMAL, section: values})


def raises(message: str):
    return pytest.raises(ConfigError, match="^" + re.escape(message))


# ---- numbers -------------------------------------------------------------------------------

BOUNDED = [  # (section, dotted key inside it, largest value allowed)
    ("rollout", "frames", MAX_FRAMES),
    ("rollout", "seed", MAX_SEED),
    ("rollout", "num_steps", MAX_NUM_STEPS),
    ("runtime", "max_sessions", MAX_SESSIONS),
    ("runtime", "kv.page_tokens", MAX_PAGE_TOKENS),
    ("runtime", "kv.window_frames", MAX_FRAMES),
    ("runtime", "kv.sink_frames", MAX_FRAMES),
    ("output", "crf", MAX_CRF),
    ("output", "scale", MAX_SCALE),
]


def nested(key: str, value) -> dict:
    first, _, rest = key.partition(".")
    return {first: nested(rest, value) if rest else value}


@pytest.mark.parametrize("section, key, largest", BOUNDED, ids=[f"{s}.{k}" for s, k, _ in BOUNDED])
def test_the_largest_value_passes_and_one_more_is_refused(section, key, largest):
    build(section, nested(key, largest))
    with raises(f"{section}.{key}: {largest + 1} is invalid; it must be <= {largest}"):
        build(section, nested(key, largest + 1))


@pytest.mark.parametrize("section, values, message", [
    ("rollout", {"seed": -1}, "rollout.seed: -1 is invalid; it must be >= 0"),
    ("rollout", {"frames": 10**40}, "rollout.frames: 100000000000000000000000...0000000000000 is "
                                    "invalid; it must be <= 1000000"),
    ("rollout", {"prompt": [{"frame": 0, "prompt": "a"}, {"frame": MAX_FRAMES + 1,
                                                          "prompt": "b"}]},
     "rollout.prompt[1].frame: 1000001 is invalid; it must be <= 1000000"),
    ("output", {"crf": -1}, "output.crf: -1 is invalid; it must be >= 0"),
    ("output", {"scale": 0}, "output.scale: 0 is invalid; it must be >= 1"),
])
def test_other_bounds(section, values, message):
    with raises(message):
        build(section, values)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_floats_must_be_finite(value):
    with raises(f"rollout.guidance_scale: {value!r} is invalid; it must be a finite number"):
        build("rollout", {"guidance_scale": value})
    with raises(f"output.fps: {value!r} is invalid; it must be a finite number; try 16"):
        build("output", {"fps": value})
    with raises(f"runtime.memory_budget: {value!r} is neither a fraction in (0, 1] nor a whole "
                f"number of bytes"):
        build("runtime", {"memory_budget": value})


@pytest.mark.parametrize("fps", [0.005, 1000.5, 5000])
def test_fps_outside_what_every_format_stores(fps):
    with raises(f"output.fps: {float(fps)!r} is invalid; it must be from 0.01 to 1000 frames "
                f"per second (what every output format stores); try 16"):
        build("output", {"fps": fps})


def test_fps_at_its_bounds_and_guidance_at_any_finite_value_pass():
    assert build("output", {"fps": MIN_FPS}).output.fps == 0.01
    assert build("output", {"fps": 1000}).output.fps == MAX_FPS
    assert build("rollout", {"guidance_scale": -7.5}).rollout.guidance_scale == -7.5


@pytest.mark.parametrize("suffix", [".mp4", ".mkv", ".webm", ".webp", ".gif", ".npy"])
@pytest.mark.parametrize("fps", [MIN_FPS, MAX_FPS])
def test_every_format_stores_the_fps_bounds(tmp_path, suffix, fps):
    """The bounds are what the encoders really accept: every frame is there to read back."""
    from ardiff.video.writer import VideoWriter

    path = tmp_path / f"out{suffix}"
    with VideoWriter(path, fps) as writer:
        writer.write(np.full((3, 16, 16, 3), 128, np.uint8))
    if suffix == ".npy":
        assert np.load(path).shape[0] == 3
    elif suffix in (".gif", ".webp"):
        assert Image.open(path).n_frames == 3
    else:
        with av.open(str(path)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 3


def test_the_seed_and_frame_bounds_fit_the_pipelines_noise_generators():
    """Noise streams are seed * SEED_STRIDE + frame: distinct for every (seed, frame) in
    bounds, and within what torch.Generator.manual_seed takes (0..2**64-1)."""
    assert MAX_FRAMES < SEED_STRIDE and MAX_FRAMES <= DEFAULT_MAX_MODEL_LEN
    assert MAX_SEED * SEED_STRIDE + MAX_FRAMES < 2**64
    torch.randn(1, generator=block_generator(MAX_SEED, MAX_FRAMES))


# ---- text ----------------------------------------------------------------------------------

@pytest.mark.parametrize("section, values, message", [
    ("rollout", {"prompt": "a \udcff cat"},
     r"rollout.prompt: 'a \udcff cat' is not valid Unicode (a lone surrogate '\udcff' at "
     r"character 2: bytes that are not UTF-8?); write it in UTF-8"),
    ("rollout", {"negative_prompt": "\ud800"}, r"rollout.negative_prompt: '\ud800' is not valid"),
    ("rollout", {"prompts": ["ok", "b\udcffad"]}, r"rollout.prompts[1]: 'b\udcffad' is not"),
    ("rollout", {"prompts": "caf\udce9.txt"}, r"rollout.prompts: 'caf\udce9.txt' is not valid"),
    ("rollout", {"actions": [["left", "\udcff"]]}, r"rollout.actions[0][1]: '\udcff' is not"),
    ("rollout", {"prompt": [{"frame": 0, "prompt": "\udcff"}]},
     r"rollout.prompt[0].prompt: '\udcff' is not valid Unicode"),
    ("output", {"path": "a\0b.mp4"},
     r"output.path: 'a\x00b.mp4' holds a NUL character at character 1; remove it"),
    ("pipeline", {"entry": "a:b", "args": {"model": {"name": ["x", "\udcff"]}}},
     r"pipeline.args: '\udcff' (at model.name[1]) is not valid Unicode"),
    ("pipeline", {"entry": "a:b", "args": {"ke\udcffy": 1}},
     r"pipeline.args: 'ke\udcffy' (at ke\udcffy) is not valid Unicode"),
])
def test_text_must_be_valid_unicode_without_nul(section, values, message):
    with raises(message):
        build(section, values)


def test_odd_but_valid_characters_are_text():
    prompt = "a\u2028b\x1b[31m \U0001F600 \u00e9"
    assert build("rollout", {"prompt": prompt}).rollout.prompt == prompt


@pytest.mark.parametrize("section, values, message", [
    ("output", {"path": "a" * 256 + ".mp4"}, "has a name of 260 bytes; file systems allow 255, "
                                             "so pick a shorter name"),
    ("output", {"path": "/".join(["d" * 200] * 21)}, "is 4220 bytes long; file systems allow "
                                                     "4095, so pick a shorter path"),
    ("rollout", {"prompts": "é" * 128 + ".txt"}, "has a name of 260 bytes"),
    ("rollout", {"actions": "x" * 300}, "has a name of 300 bytes"),
])
def test_paths_fit_the_file_systems(section, values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build(section, values)


# ---- messages do not grow with the input ---------------------------------------------------

@pytest.mark.parametrize("section, values", [
    ("rollout", {"frames": "x" * 100_000}),
    ("rollout", {"prompt": "\udcff" * 100_000}),
    ("runtime", {"memory_budget": "9" * 100_000}),
    ("runtime", {"memory_budget": "y" * 100_000}),
    ("runtime", {"kv": {"w" * 100_000: 1}}),
    ("output", {"fps": ["x" * 1000] * 1000}),
    ("pipeline", {"entry": "a:b", "args": {"x": ["\udcff" * 100_000]}}),
])
def test_a_huge_value_gives_a_short_message(section, values):
    with pytest.raises(ConfigError) as caught:
        build(section, values)
    assert len(str(caught.value)) < 500, str(caught.value)


def test_a_long_string_is_quoted_by_its_head_and_tail():
    with pytest.raises(ConfigError) as caught:
        build("rollout", {"frames": "head" + "x" * 10_000 + "tail"})
    message = str(caught.value)
    assert message.startswith("rollout.frames: expected an integer, got 'headxxx")
    assert message.endswith("xxxtail' (str)") and "..." in message

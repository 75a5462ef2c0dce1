"""The first images of a rollout's videos: which stream gets which, checked before any work.

    rollout.image: PATH          every video starts from it
    rollout.images: [PATH, ...]  one per video: as many as the prompts (--prompts), or, with
                                 one prompt, one video per image

`check_images` holds them to the pipeline's `ardiff_inputs` (`get_pipeline_inputs`): an
image given to a pipeline that takes none, or none given to one that requires it, is a
one-line `ConfigError`; every image is opened (ardiff.image) before anything loads.
Paths are relative to the config's folder (a command line's are made absolute).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ardiff.contract.inputs import get_pipeline_inputs
from ardiff.errors import ConfigError
from ardiff.image import open_image

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ardiff.config.run import RunConfig
    from ardiff.rollout.streams import RolloutPlan


def stream_images(config: RunConfig, num_streams: int) -> list[Path | None]:
    """Each stream's first image (None: none given)."""
    rollout = config.rollout
    if rollout.image is not None and rollout.images is not None:
        raise ConfigError("rollout.image and rollout.images are both set; give one image "
                          "for every video (image) or one per video (images)")
    if rollout.images is None:
        image = None if rollout.image is None else _resolve(rollout.image, config.base_dir)
        return [image] * num_streams
    if not rollout.images:
        raise ConfigError("rollout.images: the list is empty; give one image per video")
    if len(rollout.images) != num_streams:
        raise ConfigError(f"rollout.images: {len(rollout.images)} images for {num_streams} "
                          f"videos (prompts); give one image per prompt")
    return [_resolve(image, config.base_dir) for image in rollout.images]


def row_image(config: RunConfig, row: int) -> Path | None:
    """Session `row`'s first image where sessions are rows (a bench): rollout.image, or
    rollout.images in turn."""
    rollout = config.rollout
    if rollout.images:
        return _resolve(rollout.images[row % len(rollout.images)], config.base_dir)
    return None if rollout.image is None else _resolve(rollout.image, config.base_dir)


def _resolve(path: str, base_dir: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base_dir / candidate


def check_images(plan: RolloutPlan, pipeline: Any, entry: str) -> None:
    """Refuse images the pipeline does not take, and no image where it needs one; open
    each image given. Raises ConfigError (one line, before any work)."""
    inputs = get_pipeline_inputs(pipeline)
    images = [stream.image for stream in plan.streams]
    given = [image for image in images if image is not None]
    if inputs is not None and given and not inputs.takes("image"):
        raise ConfigError(f"rollout.image: pipeline {entry!r} takes no image (it ignores "
                          f"one); drop --image / rollout.image(s)")
    if inputs is not None and inputs.needs("image") and len(given) < len(images):
        raise ConfigError(f"rollout.image: pipeline {entry!r} starts each video from an "
                          f"image; give --image PATH (or rollout.image / rollout.images)")
    for image in dict.fromkeys(given):
        open_image(image, "rollout.image")

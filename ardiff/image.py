"""A session's first image: read and checked before any work, handed to the pipeline as RGB.

    open_image(source, field) -> PIL.Image.Image (RGB, EXIF orientation applied)

`source` is a path, the file's bytes (an upload) or an image already opened. Refused with a
one-line `ConfigError` naming `field`: a missing or unreadable file, bytes that are no image
Pillow reads, a file over `MAX_IMAGE_BYTES`, an image of zero size or over
`MAX_IMAGE_PIXELS` (checked from the header, before the pixels are decoded). A request
carries the image in `extra[IMAGE_KEY]` on a session's first block.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ardiff.errors import ConfigError

IMAGE_KEY = "image"  # RolloutRequest.extra key of a session's first image
MAX_IMAGE_BYTES = 32 * 1024 * 1024  # an upload or a file; a 4K PNG is ~25 MB at most
MAX_IMAGE_PIXELS = 8192 * 8192  # decoded size cap (a decompression bomb stops here)


def open_image(source: Any, field: str) -> Any:
    """The image `source` names as an RGB `PIL.Image.Image`; raises ConfigError (see above)."""
    from PIL import Image, ImageOps

    if isinstance(source, Image.Image):
        return _checked(source, field, "the image").convert("RGB")
    data, name = _read(source, field)
    try:
        with Image.open(io.BytesIO(data)) as image:
            _checked(image, field, name)
            image = ImageOps.exif_transpose(image)
            return image.convert("RGB")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Pillow raises, the file is no image
        raise ConfigError(f"{field}: {name} is not an image Pillow can read "
                          f"({type(exc).__name__}); give a PNG, JPEG or WebP file") from None


def _read(source: Any, field: str) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray)):
        if len(source) > MAX_IMAGE_BYTES:
            raise ConfigError(f"{field}: the image is {len(source)} bytes, over the limit of "
                              f"{MAX_IMAGE_BYTES}; give a smaller file")
        return bytes(source), "the uploaded file"
    path = Path(str(source)).expanduser()
    name = repr(str(path))
    if not path.is_file():
        raise ConfigError(f"{field}: {name} is not a file; give the path of an image")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ConfigError(f"{field}: {name} is {size} bytes, over the limit of "
                          f"{MAX_IMAGE_BYTES}; give a smaller image")
    try:
        return path.read_bytes(), name
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {name} ({type(exc).__name__}: "
                          f"{exc.strerror or exc})") from None


def _checked(image: Any, field: str, name: str) -> Any:
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ConfigError(f"{field}: {name} is {width}x{height} pixels; give a non-empty image")
    if width * height > MAX_IMAGE_PIXELS:
        raise ConfigError(f"{field}: {name} is {width}x{height} pixels, over the limit of "
                          f"{MAX_IMAGE_PIXELS}; scale it down first")
    return image


"""What a stream's client receives: a bounded queue of frames, and each frame's message.

    queue = FrameQueue(max_frames=64, on_put=wake)   # one per session; on_put from any thread
    dropped = queue.put(frame)                       # the oldest dropped when it is full
    frame = queue.pop()                              # None when empty
    message = frame_message(frame, "jpeg", quality=85)

A message is binary, one per frame:

    | 4 bytes: header length N (big-endian) | N bytes: JSON header (UTF-8) | image bytes |

    header: {"frame": 17, "block": 5, "latency_ms": 12.5, "actions": ["left"],
             "prompt": "...", "dropped": 0, "format": "jpeg", "width": 32, "height": 32}

`frame` counts the session's video frames from 0 and `dropped` the frames this client lost
so far (a slow reader: the queue keeps the newest `max_frames`). Frames leave in order.
"""

from __future__ import annotations

import io
import json
import struct
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

HEADER_LENGTH = struct.Struct(">I")
_PILLOW_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


@dataclass(frozen=True)
class Frame:
    """One video frame of a session and where it came from."""

    index: int                 # the session's video frame, from 0
    block: int                 # the AR block that made it
    latency_s: float           # that block's forward
    actions: tuple[str, ...] | None
    prompt: str
    pixels: np.ndarray         # uint8 [H, W, 3]


class FrameQueue:
    """Bounded, thread-safe; a full queue drops its oldest frame and counts it."""

    def __init__(self, max_frames: int, on_put: Callable[[], None] | None = None) -> None:
        self.max_frames = max_frames
        self.on_put = on_put
        self.dropped = 0
        self._frames: deque[Frame] = deque()
        self._lock = threading.Lock()

    def put(self, frame: Frame) -> int:
        """Queue `frame`; returns how many frames were dropped to make room (0 or 1)."""
        with self._lock:
            dropped = 0
            if len(self._frames) >= self.max_frames:
                self._frames.popleft()
                dropped = 1
                self.dropped += 1
            self._frames.append(frame)
            on_put = self.on_put
        if on_put is not None:
            on_put()
        return dropped

    def wake(self) -> None:
        """Tell the reader something changed (the session ended) without a frame."""
        on_put = self.on_put
        if on_put is not None:
            on_put()

    def pop(self) -> Frame | None:
        with self._lock:
            return self._frames.popleft() if self._frames else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)


def encode_image(pixels: np.ndarray, image: str, quality: int) -> bytes:
    """One frame as `image` (jpeg, png or webp) bytes, through Pillow."""
    from PIL import Image

    buffer = io.BytesIO()
    options = {} if image == "png" else {"quality": quality}
    Image.fromarray(np.ascontiguousarray(pixels), "RGB").save(
        buffer, _PILLOW_FORMATS[image], **options)
    return buffer.getvalue()


def frame_message(frame: Frame, image: str, quality: int, dropped: int) -> bytes:
    """The binary message of one frame (see the module docstring)."""
    height, width = int(frame.pixels.shape[0]), int(frame.pixels.shape[1])
    header = json.dumps({
        "frame": frame.index, "block": frame.block, "latency_ms": round(frame.latency_s * 1e3, 3),
        "actions": None if frame.actions is None else list(frame.actions),
        "prompt": frame.prompt, "dropped": dropped, "format": image,
        "width": width, "height": height}).encode()
    return HEADER_LENGTH.pack(len(header)) + header + encode_image(frame.pixels, image, quality)


def parse_frame_message(message: bytes) -> tuple[dict[str, object], bytes]:
    """A frame message's (header, image bytes): what a Python client does with one."""
    (length,) = HEADER_LENGTH.unpack_from(message)
    end = HEADER_LENGTH.size + length
    return json.loads(message[HEADER_LENGTH.size:end]), message[end:]

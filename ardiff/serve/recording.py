"""A session's recorded video: every frame it made, through the video writer, in segments.

    recording = Recording(folder / "session-3.mp4", fps=16, keep=None)
    recording.write(frames)          # the scheduler's thread: uint8 [F, H, W, 3]
    recording.roll()                 # finish the segment so far (a block boundary)
    recording.join(target)           # every finished segment as one mp4 (packets copied)
    recording.close()                # the last segment finished, all joined into `path`
                                     # (then `keep(path)` moves it where it stays)

    session-3.mp4.part0.mp4 | session-3.mp4.part1.mp4 | ...   --join-->   session-3.mp4

An mp4 is playable once its writer closes, so "the video so far" of a live session is its
segments: `roll` closes the open one (`ardiff.video.writer.VideoWriter`, which alone writes
the files) and the next frames open another. Joining copies packets (no re-encode); `join`
first joins the finished segments into one, which the next `join` reuses, so however often
a client asks for the video a live session holds at most two segments. Only the scheduler's
thread writes and rolls; `join` runs on any thread; the lock keeps the segment list whole.
"""

from __future__ import annotations

import contextlib
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ardiff.video.writer import VideoWriter


class Recording:
    """Segments of one session's mp4; `frames` counts what reached the writer."""

    def __init__(self, path: Path, fps: float, scale: int = 1,
                 keep: Callable[[Path], Path] | None = None) -> None:
        self.path, self.fps, self.scale, self.keep = path, fps, scale, keep
        self.frames = 0
        self.kept = False
        self._segments: list[Path] = []
        self._parts = 0  # segment files made: each new one gets the next number
        self._writer: VideoWriter | None = None
        self._lock = threading.Lock()  # the list of finished segments and their files

    def _next_part(self) -> Path:
        self._parts += 1
        return self.path.with_name(f"{self.path.name}.part{self._parts - 1}.mp4")

    def write(self, frames: np.ndarray) -> None:
        if self._writer is None:
            with self._lock:
                part = self._next_part()
            self._writer = VideoWriter(part, self.fps, scale=self.scale)
        self._writer.write(frames)
        self.frames += int(frames.shape[0])

    def roll(self) -> None:
        """Finish the open segment, if any (it then plays on its own)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        info = writer.close()
        if info.frames:
            with self._lock:
                self._segments.append(Path(info.path))

    def segments(self) -> list[Path]:
        with self._lock:
            return list(self._segments)

    def join(self, target: Path) -> int:
        """Write the finished segments as one mp4 at `target`; returns its frames (0: none,
        and nothing written). Several finished segments become one first (reused later)."""
        with self._lock:
            if len(self._segments) > 1:
                joined = self._next_part()
                join_segments(self._segments, joined)
                for segment in self._segments:
                    segment.unlink(missing_ok=True)
                self._segments = [joined]
            if not self._segments:
                return 0
            return join_segments(self._segments, target)

    def close(self) -> Path | None:
        """Finish the last segment and join them into `path`, then hand it to `keep` (the
        path it moved to is `path` from then on). None: no frame was made."""
        self.roll()
        with self._lock:
            segments = self._segments
            if not segments:
                return None
            if segments != [self.path]:
                if len(segments) == 1:
                    segments[0].replace(self.path)
                else:
                    join_segments(segments, self.path)
                    for segment in segments:
                        segment.unlink(missing_ok=True)
            if self.keep is not None and not self.kept:
                self.path, self.kept = self.keep(self.path), True
            self._segments = [self.path]
            return self.path

    def remove(self) -> None:
        """Remove every file the recording made and did not keep."""
        self.roll()
        with self._lock:
            if not self.kept:
                for segment in self._segments:
                    with contextlib.suppress(OSError):
                        segment.unlink()
                self._segments = []


def join_segments(segments: list[Path], target: Path) -> int:
    """Copy the video packets of `segments`, in order, into one mp4 at `target`, each
    segment's timestamps shifted to follow the last; returns the frames (packets) written."""
    import av

    packets = 0
    with av.open(str(target), "w", format="mp4") as output:
        stream = None
        offset = 0
        for segment in segments:
            with av.open(str(segment)) as source:
                video = source.streams.video[0]
                if stream is None:
                    stream = output.add_stream_from_template(video)
                end = offset
                for packet in source.demux(video):
                    if packet.dts is None:  # the demuxer's flush packet
                        continue
                    duration = packet.duration or _ticks_per_frame(video)
                    packet.pts += offset
                    packet.dts += offset
                    end = max(end, packet.pts + duration)
                    packet.stream = stream
                    output.mux(packet)
                    packets += 1
                offset = end
    return packets


def _ticks_per_frame(video: Any) -> int:
    rate = video.average_rate or video.guessed_rate or Fraction(16)
    return max(1, int(round(1 / (rate * video.time_base))))

"""Where encoded bytes meet the disk: work files, the space reserve, publishing.

A writer encodes into a *work* path beside its target, unique to the process and the
writer, and publishes it when the run ends:

    out.mp4                                  the target: the old file until publish
    .out.mp4.<pid>-<hex>.partial.mp4         the work file (one per writer)
    .out.mp4.<pid>-<hex>.partial.mp4.reserve the space reserve (PyAV formats)
    frames/.partial-<pid>-<hex>/             a PNG folder's work folder, inside it

Publishing a file is one `os.replace` (the last run to finish wins; a FIFO or device gets
the finished file's bytes and stays what it is); a PNG folder gets its frames moved in one
by one under a lock, then loses the `frame_*.png` the run did not write. Finishing a
container needs room (mp4's index, mkv's cues, frames the codec holds), so a PyAV encoder
holds a `SpaceReserve` that the first write meeting a full disk frees. A run killed
outright leaves its work behind; the next writer of the target removes it (leftovers.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import select
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator

from ardiff.path_text import landing

try:
    import fcntl
except ImportError:  # not POSIX: concurrent PNG-folder publishes are not serialised
    fcntl = None

RESERVE_BYTES = 16 * 2**20  # holds an mkv cluster (<= 5 MiB) or mp4's index plus codec delay
_SMALLER_RESERVE = 16       # a disk that cannot spare RESERVE_BYTES may spare 1/16 of it
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
FRAME_PATTERN = "frame_*.png"
RESERVE_SUFFIX = ".reserve"
COPY_CHUNK_BYTES = 1 << 20  # a finished file copied into a FIFO or device, this much at a time
STREAM_WAIT_S = 5.0  # how long an output that is a FIFO waits for its reader (to open, per part)
STREAM_POLL_S = 0.05
_TAG = r"(?P<pid>[0-9]+)-[0-9a-f]{8}"  # work_path's <pid>-<hex>


def work_path(target: Path, folder: bool = False) -> Path:
    """A fresh work path for `target` (see the module docstring); nothing is created."""
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    if folder:
        return target / f".partial-{tag}"
    return target.with_name(f".{target.name}.{tag}.partial{target.suffix}")


def work_pattern(target: Path, folder: bool = False) -> re.Pattern[str]:
    """The names `work_path` gives `target`'s work (and `reserve_path` its reserve), with the
    writer's pid as the group `pid`; they sit in `target` (a folder) or beside it."""
    if folder:
        return re.compile(rf"\.partial-{_TAG}")
    return re.compile(rf"\.{re.escape(target.name)}\.{_TAG}\.partial{re.escape(target.suffix)}"
                      rf"(?:{re.escape(RESERVE_SUFFIX)})?")


def reserve_path(work: Path) -> Path:
    return work.with_name(work.name + RESERVE_SUFFIX)


def _write(fd: int, data: memoryview) -> int:
    """os.write: the one place encoded bytes go to a disk (tests put a full disk here)."""
    return os.write(fd, data)


def _allocate(fd: int, offset: int, nbytes: int) -> None:
    """os.posix_fallocate: the one place disk space is reserved (tests put a full disk here)."""
    os.posix_fallocate(fd, offset, nbytes)


class SpaceReserve:
    """Disk space allocated at `path` to finish a file once the disk is full: RESERVE_BYTES,
    or 1/16 of it when the disk cannot spare that.

    Best effort: `held` is False when no space could be allocated; `disk_full` says the
    disk had no room for it (rather than no way to preallocate). `release` frees it
    (idempotent) and says whether there was any.
    """

    def __init__(self, path: Path) -> None:
        self.path, self.held, self.disk_full = path, False, False
        for nbytes in (RESERVE_BYTES, RESERVE_BYTES // _SMALLER_RESERVE):
            if nbytes > 0 and self._allocate(nbytes):
                self.held, self.disk_full = True, False
                return

    def _allocate(self, nbytes: int) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                _allocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except (OSError, AttributeError) as exc:  # full, no preallocation, no posix_fallocate
            self.disk_full = getattr(exc, "errno", None) in DISK_FULL
            self.release()
            return False
        return True

    def release(self) -> bool:
        held, self.held = self.held, False
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        return held


class OutputFile:
    """An unbuffered binary file the encoders (and PyAV, as a file object) write through.

    Every `write` puts all its bytes on disk or raises OSError. The first full-disk
    error spends the reserve, if any, and retries; it is kept in `disk_error` for the
    encoder to stop on. An error a write raises is kept in `write_error` too, since
    PyAV does not always pass it on. Writing after `close` raises ValueError (never a
    reused fd).
    """

    def __init__(self, path: Path, reserve: SpaceReserve | None = None) -> None:
        self.path, self._reserve = path, reserve
        self.disk_error: OSError | None = None   # absorbed by the reserve
        self.write_error: OSError | None = None  # raised to the caller: bytes are missing
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)

    @property
    def error(self) -> OSError | None:
        """The first write error, absorbed or not: the encoder stops on it."""
        return self.write_error or self.disk_error

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                done += _write(self._fileno(), view[done:])
            except OSError as exc:
                if not self._spend_reserve(exc):
                    self.write_error = self.write_error or exc
                    raise
        return done

    def _spend_reserve(self, exc: OSError) -> bool:
        if exc.errno not in DISK_FULL or self._reserve is None or not self._reserve.release():
            return False
        self.disk_error = exc
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return os.lseek(self._fileno(), offset, whence)

    def tell(self) -> int:
        return self.seek(0, os.SEEK_CUR)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fileno(), size)

    def flush(self) -> None:
        pass  # unbuffered

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _fileno(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path}: write to a closed output file")
        return self._fd


def publish_file(work: Path, target: Path) -> int:
    """Move the finished `work` file onto `target` atomically (a FIFO or device: copy it in,
    the node stays); returns its size in bytes."""
    size = work.stat().st_size
    if landing(target)[1]:
        _copy_into(work, target)
    else:
        os.replace(work, target)
    return size


def _copy_into(work: Path, target: Path) -> None:
    with open(work, "rb") as source:
        write_stream(target, iter(lambda: source.read(COPY_CHUNK_BYTES), b""))


def write_stream(target: Path, chunks: Iterable[bytes]) -> None:
    """Write `chunks` into the FIFO or device `target`, which stays what it is, never waiting
    for good: a FIFO's reader must come within STREAM_WAIT_S and take each part within it,
    else TimeoutError (its message says which). Other failures are the OSError."""
    fd = open_stream(target)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                if not select.select([], [fd], [], STREAM_WAIT_S)[1]:
                    raise TimeoutError(f"its reader took nothing for {STREAM_WAIT_S:g} s")
                with contextlib.suppress(BlockingIOError):  # less room than this part needs
                    view = view[_write(fd, view):]
    finally:
        os.close(fd)


def open_stream(target: Path) -> int:
    """A non-blocking write descriptor of the FIFO or device `target`: a FIFO that no
    process reads gets STREAM_WAIT_S for a reader to open it, then TimeoutError."""
    deadline = time.monotonic() + STREAM_WAIT_S
    while True:
        try:
            return os.open(target, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: a FIFO with no reader
                raise
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no reader opened it within {STREAM_WAIT_S:g} s") from None
            time.sleep(STREAM_POLL_S)


@contextlib.contextmanager
def written_through(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Where code that writes a whole file by name writes the file for `path`: `path` itself,
    or when it lands on a FIFO or device, a temporary file whose bytes go there once the
    code is done (`write_stream`: TimeoutError when a FIFO gets no reader). A picture needs
    a seekable file; a FIFO's reader gets one whole file, as from a video. A file (a
    symlink's target) is written as a work file beside it and moved onto it when whole: a
    full disk or an error keeps the old file and leaves no half one."""
    target, stream = landing(path)
    if not stream:
        work = work_path(target)  # the suffix the user gave names the format (a link's
        if work.suffix != Path(path).suffix:  # target may have another, or none)
            work = work.with_name(work.name + Path(path).suffix)
        try:
            yield work
            with contextlib.suppress(OSError):  # a new file gets the umask's mode
                os.chmod(work, stat.S_IMODE(os.stat(target).st_mode))
            os.replace(work, target)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(work)
        return
    with tempfile.TemporaryDirectory(prefix="ardiff-") as folder:
        work = Path(folder) / Path(path).name
        yield work
        with open(work, "rb") as source:
            write_stream(target, iter(lambda: source.read(COPY_CHUNK_BYTES), b""))


def publish_folder(work: Path, target: Path) -> int:
    """Move `work`'s frames into `target`, then remove the frames this run did not write;
    returns their bytes. Under an exclusive lock on `target`: once the runs have ended it
    holds one run's frames (the last to publish); meanwhile a reader may see a mix."""
    frames = sorted(work.glob(FRAME_PATTERN))
    size = sum(frame.stat().st_size for frame in frames)
    names = {frame.name for frame in frames}
    with _locked(target):
        for frame in frames:
            os.replace(frame, target / frame.name)
        for stale in target.glob(FRAME_PATTERN):
            if stale.name not in names:
                stale.unlink(missing_ok=True)
    discard(work)
    return size


@contextlib.contextmanager
def _locked(folder: Path):
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def discard(work: Path) -> None:
    """Remove a work file or folder and its reserve; quiet when they are gone already (or
    cannot even be looked at: a name too long, a folder gone)."""
    try:
        is_folder = work.is_dir() and not work.is_symlink()
    except OSError:
        return
    if is_folder:
        shutil.rmtree(work, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(work)
    with contextlib.suppress(OSError):
        os.unlink(reserve_path(work))

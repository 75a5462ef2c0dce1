"""What a killed run leaves beside its output, and who may remove it.

A writer cleans up its work on every exit its process survives (writer.py). SIGKILL, the
OOM killer or a lost machine leave it: a work file and its 16 MiB space reserve, or a PNG
folder's hidden work folder (names in disk.py). The next writer of the same target removes
them, and only them:

    .out.mp4.4242-1f2e3d4c.partial.mp4          pid 4242 gone, no lock held   -> removed
    .out.mp4.4242-1f2e3d4c.partial.mp4.reserve  ... with its work file        -> removed
    .out.mp4.5151-a0b1c2d3.partial.mp4          pid 5151 running here         -> kept
    .out.mp4.6060-99aa88bb.partial.mp4          pid gone, a process holds its lock
                                                (another pid namespace or machine) -> kept

    leftovers.remove_dead_work(Path("out.mp4"))        # before a new writer starts
    lock = leftovers.WorkLock(work); ...; lock.release()  # held while a writer owns `work`
"""

from __future__ import annotations

import os
from pathlib import Path

from ardiff.video import disk

try:
    import fcntl
except ImportError:  # not POSIX: no locks; the pid alone decides
    fcntl = None


class WorkLock:
    """An exclusive `flock` on a work file or folder, held from when the writer makes it until
    the writer is done with it. The kernel drops it when the process ends, however it ends,
    so `remove_dead_work` never takes a live run's work for a dead one's, even a run in
    another pid namespace or on another machine sharing the folder. Best effort: no lock
    where there is no flock. `release` is idempotent."""

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        if fcntl is None:
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        if not _try_lock(fd):
            os.close(fd)
            return
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # drops the lock


def remove_dead_work(target: Path, folder: bool = False) -> list[Path]:
    """Remove what killed runs left at `target` (`folder`: a PNG folder): work files, their
    space reserves and PNG work folders whose pid (in the name) is no live process here and
    whose `WorkLock` no process holds. Returns the work paths removed; quiet about what
    cannot be looked at or removed (it stays, as it was)."""
    where, pattern = (target if folder else target.parent), disk.work_pattern(target, folder)
    try:
        names = sorted(os.listdir(where))
    except OSError:  # no such folder yet, or not readable
        return []
    removed: list[Path] = []
    for name in names:
        found = pattern.fullmatch(name)
        if found is None or is_running(int(found["pid"])):
            continue
        work = where / name.removesuffix(disk.RESERVE_SUFFIX)  # a reserve: its work file
        if work not in removed and _remove_unlocked(work):
            removed.append(work)
    return removed


def is_running(pid: int) -> bool:
    """Whether `pid` is a live process here: a zombie (killed, not yet reaped) is not; a
    process of another user is; so is every pid where this cannot be told."""
    if os.name != "posix" or pid == os.getpid():  # Windows' os.kill(pid, 0) would kill it
        return True
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # another user's (EPERM), or not a pid
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rpartition(")")[2].split()  # the name may hold spaces
    except OSError:  # no /proc here, or the process just went
        return False
    return bool(fields) and fields[0] == "Z"


def _remove_unlocked(work: Path) -> bool:
    """Remove `work` and its reserve unless a process holds its lock; True if removed."""
    try:  # never through a symlink, never waiting on a FIFO: those are not a run's work
        fd = os.open(work, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:  # a reserve whose work file was never made
        fd = None
    except OSError:
        return False
    try:
        if fd is not None and not _try_lock(fd):
            return False  # a live run holds it
        disk.discard(work)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def _try_lock(fd: int) -> bool:
    """Take `fd`'s exclusive flock without waiting; False if another holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without flock: the pid alone decides
        return True
    return True

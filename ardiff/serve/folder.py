"""Where one `ardiff serve` process writes: its own hidden folder, and kept videos beside it.

    serve.output_dir/                       (the user's folder: nothing in it is touched)
      .ardiff-serve-4242-1f2e3d4c/          this process's work (pid 4242, flock held)
        session-3.mp4.part0.mp4 ...         segments, the video writer's work files
      session-1.mp4                         a kept video (serve.keep_videos), under the first
                                            free name: never one that exists

    folder = RunFolder.open(config)     # sweeps what killed runs left, makes its own
    folder.recording_path(3)            # a path inside its own folder
    folder.keep(path)                   # -> serve.output_dir/session-<n>.mp4 (n free)
    folder.close()                      # its own folder removed; kept videos stay

The server removes only its own folder, so a folder of the user's files loses none, and a
kept video is moved out under a name nobody has (an atomic link), so a restart never
overwrites one. A killed run's folder (its pid gone, its lock free) is removed by the next
server that opens the same folder (as `ardiff.video.leftovers` does for a rollout). With
no serve.output_dir, the output folder is a new temporary one, `ardiff-serve-<pid>-*`,
removed at stop unless it holds kept videos; a killed run's is swept the same way.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

from ardiff.config.run import RunConfig
from ardiff.errors import ConfigError
from ardiff.video.leftovers import WorkLock, is_running

try:
    import fcntl
except ImportError:  # not POSIX: no locks
    fcntl = None  # type: ignore[assignment]

WORK_PREFIX = ".ardiff-serve-"
TEMP_PREFIX = "ardiff-serve-"
_WORK = re.compile(rf"{re.escape(WORK_PREFIX)}(?P<pid>\d+)-[0-9a-f]+")
_TEMP = re.compile(rf"{re.escape(TEMP_PREFIX)}(?P<pid>\d+)-.+")
MAX_KEEP_TRIES = 100_000  # session-<n>.mp4 names looked at before giving up


class RunFolder:
    """This process's work folder inside `output_dir`; see the module docstring."""

    def __init__(self, output_dir: Path, owns_output_dir: bool) -> None:
        self.output_dir, self.owns_output_dir = output_dir, owns_output_dir
        self.work = output_dir / f"{WORK_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.work.mkdir()
        self._lock = WorkLock(self.work)  # the kernel drops it however the process ends
        self.kept = 0

    @classmethod
    def open(cls, config: RunConfig) -> RunFolder:
        """serve.output_dir (made if missing), swept of killed runs' folders, or a new
        temporary folder; ConfigError when it cannot be made."""
        if config.serve.output_dir is None:
            sweep_temp()
            root = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
            return cls(root, owns_output_dir=True)
        folder = Path(config.serve.output_dir)
        if not folder.is_absolute():
            folder = config.base_dir / folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"serve.output_dir: cannot create {str(folder)!r} "
                              f"({type(exc).__name__}: {exc.strerror}); choose a writable "
                              f"folder") from exc
        sweep(folder)
        return cls(folder.resolve(), owns_output_dir=False)

    def recording_path(self, number: int) -> Path:
        return self.work / f"session-{number}.mp4"

    def keep(self, path: Path) -> Path:
        """Move `path` (in this folder) to output_dir as `session-<n>.mp4`, n the first
        number no file has; the new path. Never replaces a file (a hard link is atomic)."""
        for number in range(1, MAX_KEEP_TRIES):
            target = self.output_dir / f"session-{number}.mp4"
            try:
                os.link(path, target)
            except FileExistsError:
                continue
            path.unlink()
            self.kept += 1
            return target
        raise OSError(f"no free session-<n>.mp4 name in {self.output_dir}")

    def close(self) -> None:
        """Remove this process's folder (a temporary output folder too, unless it holds
        kept videos). Safe to call twice."""
        shutil.rmtree(self.work, ignore_errors=True)
        self._lock.release()
        if self.owns_output_dir:
            try:
                self.output_dir.rmdir()  # only if empty: kept videos stay
            except OSError:
                pass


def sweep(folder: Path) -> list[Path]:
    """Remove the work folders of killed servers in `folder` (pid gone, lock free)."""
    removed = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        found = _WORK.fullmatch(name)
        if found is None or is_running(int(found["pid"])) or not _is_free(folder / name):
            continue
        shutil.rmtree(folder / name, ignore_errors=True)
        removed.append(folder / name)
    return removed


def sweep_temp() -> list[Path]:
    """The same for killed servers' temporary output folders (then removed if empty)."""
    root, removed = Path(tempfile.gettempdir()), []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    for name in names:
        found = _TEMP.fullmatch(name)
        if found is None or is_running(int(found["pid"])):
            continue
        removed += sweep(root / name)
        try:
            (root / name).rmdir()
        except OSError:
            continue
        removed.append(root / name)
    return removed


def _is_free(work: Path) -> bool:
    """No process holds the folder's lock (and it is a real folder, not a link)."""
    try:
        fd = os.open(work, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if fcntl is None:
            return True  # no locks here: the pid alone decides
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:  # a file system without flock: the pid alone decides
        return True
    finally:
        os.close(fd)

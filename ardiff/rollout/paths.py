"""The paths a command reads and writes, checked together before any work.

    check_path_text("--json", text)                  # one path string, on its own
    check_written_file("--report", text)             # a file output can land where it leads
    check_run_paths(written, read)                   # no written path is another or an input
    check_rollout_paths(config, config_file=..., stats_file=..., written=..., pipeline=...)

Written: the videos (`output.path`), `--json`, `--report`, `--plot`, `--actions-out`. Read:
the config file, the prompts and actions files, a `file.py:attr` entry's file and what the
pipeline declares it loads (`ar_diffusion_input_paths`). Every written path is a file of its
own: not another written path, not a read one, not an existing file inside a folder that is
read. "One file" means one resolved path, whatever the spelling (`~`, relative, `a/../b`,
symlinks), or one device and inode when it exists (hard links). An output is written where
it leads (`landing`): a symlink's target, a FIFO or device as it is (/dev/stdout's pipe or
terminal too); one that leads to anything else (a socket) is refused. Only strings and the
file system are read; nothing is created.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path
from typing import Any, Sequence

from ardiff.engine.loader import declared_input_paths, entry_file
from ardiff.errors import ConfigError, OutputPathError
from ardiff.path_text import EXAMPLE_NAMES, check_not_a_loop, check_path_text, landing
from ardiff.rollout.inputs import input_file
from ardiff.rollout.streams import output_paths
from ardiff.video import disk, formats
from ardiff.video.writer import output_kind

NamedPath = tuple[str, "str | os.PathLike"]  # (field, the path as the user wrote it)


def check_rollout_paths(config: Any, outputs: Sequence[Path] | None = None, *,
                        config_file: str | os.PathLike | None = None,
                        stats_file: str | None = None,
                        written: Sequence[tuple[str, str | os.PathLike | None]] = (),
                        pipeline: object = None) -> None:
    """Check every path a command running `config` reads and writes, before any work.

    `outputs`: the videos (None: planned from the config, which reads the prompts file;
    () for a command that writes none). `stats_file`: `--json` (None or '-': none);
    `written`: the command's other files, (flag, path or None). `config_file`: the config's
    own file, if any; `pipeline`: the built pipeline, whose declared inputs are read too.
    Raises OutputPathError / ConfigError / PipelineLoadError (from the pipeline's hook).
    """
    files: list[NamedPath] = [] if stats_file in (None, "-") else [("--json", stats_file)]
    files += [(field, os.fspath(path)) for field, path in written if path is not None]
    for field, path in files:
        check_written_file(field, path)
    videos = output_paths(config) if outputs is None else outputs
    for video in videos:
        check_not_a_loop("output.path", video)
        check_not_special("output.path", os.fspath(video), landing(video)[1])
    check_run_paths([*(("output.path", path) for path in videos), *files],
                    read_paths(config, config_file, pipeline))


def read_paths(config: Any, config_file: str | os.PathLike | None = None,
               pipeline: object = None) -> list[NamedPath]:
    """What a run of `config` reads: the config file, the prompts and actions files, the
    entry's file and (given the built `pipeline`) what it declares it loads."""
    read: list[NamedPath] = [] if config_file is None else [("config", config_file)]
    for field, value in (("rollout.prompts", config.rollout.prompts),
                         ("rollout.actions", config.rollout.actions)):
        path = input_file(field, value, config.base_dir)
        if path is not None:
            read.append((field, path))
    entry = entry_file(config.pipeline.entry, config.base_dir)
    if entry is not None:
        read.append(("pipeline.entry", entry))
    return read + ([] if pipeline is None else declared_input_paths(pipeline))


def check_written_file(field: str, text: str | os.PathLike) -> None:
    """A file output can be written where it lands (`landing`): a regular file (or a new one)
    is replaced through a work file in the folder of its target (a symlink's target), so
    that folder must exist and be writable; a device or FIFO is written into as it is."""
    check_path_text(field, text)
    shown = os.fspath(text)
    try:
        check_not_a_loop(field, shown)
        _check_landing(field, shown)
    except OSError as exc:  # a folder this user may not look into, a loop of links...
        raise ConfigError(f"{field}: cannot look at {shown!r} ({type(exc).__name__}: "
                          f"{exc.strerror or exc}); check the path or pick another") from exc


def _check_landing(field: str, shown: str) -> None:
    target, stream = landing(shown)
    check_not_special(field, shown, stream)
    folder = target.parent
    if not folder.is_dir():
        raise ConfigError(f"{field}: {shown!r} is in a folder that does not exist "
                          f"({str(folder)!r}); create it first or pick another path")
    if target.is_dir():
        example = os.path.join(shown, EXAMPLE_NAMES.get(field, "name.ext"))
        raise ConfigError(f"{field}: {shown!r} is a folder; give a file name like {example!r}")
    writable = os.access(target, os.W_OK) if stream else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise ConfigError(f"{field}: {shown!r} is not writable; fix the permissions of the "
                          f"file or of its folder {str(folder)!r}, or pick another path")


def check_not_special(field: str, shown: str, stream: bool) -> None:
    """Refuse an output that leads to what is neither a file, a folder, a FIFO nor a device
    (`stream`: it is a FIFO or device, per `landing`)."""
    kind = None if stream else _special_kind(shown)
    if kind is not None:
        raise OutputPathError(f"{field}: {shown!r} leads to {kind}; ardiff writes into files, "
                              f"FIFOs and devices; pick another path")


def _special_kind(shown: str) -> str | None:
    """What an existing path that is neither a file, a folder, a FIFO nor a device leads to
    (a socket: /dev/stdout of a process whose stdout is one), as the kernel sees it."""
    try:
        mode = os.stat(Path(shown).expanduser()).st_mode
    except OSError:  # nothing there yet (or unreadable: the folder checks say so)
        return None
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"a file of type {stat.S_IFMT(mode):#o}"


def check_run_paths(written: Sequence[NamedPath], read: Sequence[NamedPath]) -> None:
    """Every written path is its own file: neither another written path nor a read one, nor
    an existing file inside a read folder.

    Raises OutputPathError naming the written path's field, both spellings and the fix.
    Linear in the number of paths (a prompts file may give thousands of outputs) times the
    read folders (a pipeline's few).
    """
    seen: dict[tuple, tuple[str, Any, bool]] = {}  # identity -> (field, path, is read)
    folders: list[tuple[Path, str, Any]] = []
    for field, path in read:
        seen.setdefault(_identity(path), (field, path, True))
        if _is_folder(path):
            folders.append((_resolved(path), field, path))
    for field, path in written:
        key = _identity(path)
        if key in seen:
            raise OutputPathError(_collision(field, path, *seen[key]))
        _check_outside(field, path, folders)
        if field == "output.path" and output_kind(path) == formats.DIRECTORY:
            others = [(other, name) for other, name in written if other != "output.path"]
            _check_no_frame_file(path, [*((*named, True) for named in read),
                                        *((*named, False) for named in others)])
        seen[key] = (field, path, False)


def _check_no_frame_file(path, files: Sequence[tuple[str, Any, bool]]) -> None:
    """A PNG folder gets every `frame_*.png` replaced (and those the run did not write
    removed): a file the run reads or writes, (field, path, is read), must not be one."""
    folder = _resolved(path)
    for field, other, reads in files:
        resolved = _resolved(other)
        if resolved.parent == folder and fnmatch.fnmatch(resolved.name, disk.FRAME_PATTERN):
            verb = "overwrite its input" if reads else "write it twice, and one would be lost"
            raise OutputPathError(
                f"output.path: {os.fspath(path)!r} is a folder of PNG frames that holds "
                f"{field} {resolved.name!r}; the run replaces every {disk.FRAME_PATTERN} in "
                f"it, so it would {verb}; move the {'input' if reads else 'file'} or pick "
                f"another folder")


def _check_outside(field: str, path, folders: list[tuple[Path, str, Any]]) -> None:
    """An existing file inside a folder the run reads would be overwritten: refused. A new one
    changes nothing the run reads."""
    resolved = _resolved(path)
    if not folders or not resolved.exists():
        return
    for folder, other_field, other in folders:
        if resolved.is_relative_to(folder):
            raise OutputPathError(
                f"{field}: {os.fspath(path)!r} is inside {other_field} {os.fspath(other)!r}, "
                f"a folder the run reads; the run would overwrite its input; pick another "
                f"name, like {EXAMPLE_NAMES.get(field, 'another')!r}")


def _collision(field: str, path, other_field: str, other, reads: bool) -> str:
    shown, other_shown = os.fspath(path), os.fspath(other)
    both = "" if shown == other_shown else f" (both are {str(_resolved(path))!r})"
    if field == other_field:  # two streams of one output template
        return (f"{field}: two streams would write one file, {other_shown!r} and {shown!r}"
                f"{both}; put {{index}} in the file name so each stream gets its own")
    verb = "overwrite its input" if reads else "write it twice, and one would be lost"
    return (f"{field}: {shown!r} is the same file as {other_field} {other_shown!r}{both}; the "
            f"run would {verb}; pick another name, like {EXAMPLE_NAMES.get(field, 'another')!r}")


def is_same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two spellings name one file (or folder), existing or not."""
    return _identity(a) == _identity(b)


def _identity(path: str | os.PathLike) -> tuple:
    """The file's device and inode when it exists (hard links too), else its resolved path."""
    resolved = _resolved(path)
    try:
        stat = os.stat(resolved)
    except OSError:
        return ("path", str(resolved))
    return ("inode", stat.st_dev, stat.st_ino)


def _is_folder(path: str | os.PathLike) -> bool:
    try:
        return _resolved(path).is_dir()
    except OSError:
        return False


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))

"""The paths a run reads and writes, checked together before any compute.

    check_path_text("--json", text)                         # one path string, on its own
    check_run_paths(written, read)                          # no two of them are one file
    check_rollout_paths(config, config_file=..., stats_file=...)   # all of a rollout's

Every written path (outputs, `--json`) is a file of its own: not another output, not an
input (config, prompts, actions). "One file" means one resolved path, whatever the
spelling (`~`, relative, `a/../b`, symlinks), or one device and inode when it exists (hard
links). Only strings and the file system are read; nothing is created.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ardiff.errors import ConfigError, OutputPathError
from ardiff.path_text import EXAMPLE_NAMES, check_path_text
from ardiff.rollout.inputs import input_file
from ardiff.rollout.streams import output_paths

NamedPath = tuple[str, "str | os.PathLike"]  # (field, the path as the user wrote it)


def check_rollout_paths(config: Any, outputs: Sequence[Path] | None = None, *,
                        config_file: str | os.PathLike | None = None,
                        stats_file: str | None = None) -> None:
    """Check every path a rollout of `config` touches, before any compute.

    `outputs`: the streams' output paths (None: planned from the config, which reads
    the prompts file). `config_file`: the config's own file, if any; `stats_file`:
    `--json` (None or '-': none). Raises OutputPathError / ConfigError.
    """
    written: list[NamedPath] = [("output.path", path)
                                for path in (output_paths(config) if outputs is None else outputs)]
    if stats_file not in (None, "-"):
        check_stats_file(stats_file)
        written.append(("--json", stats_file))
    read: list[NamedPath] = [] if config_file is None else [("config", config_file)]
    for field, value in (("rollout.prompts", config.rollout.prompts),
                         ("rollout.actions", config.rollout.actions)):
        path = input_file(field, value, config.base_dir)
        if path is not None:
            read.append((field, path))
    check_run_paths(written, read)


def check_stats_file(text: str) -> None:
    """The `--json` file can be written where it really is written: a regular file (or a new
    one) is replaced through a work file in the folder of its target (a symlink's target),
    so that folder must exist and be writable; a device or FIFO is written directly."""
    check_path_text("--json", text)
    path = Path(text).expanduser()
    target = Path(os.path.realpath(path))
    folder = target.parent
    if not folder.is_dir():
        raise ConfigError(f"--json: {text!r} is in a folder that does not exist "
                          f"({str(folder)!r}); create it first or pick another path")
    if target.is_dir():
        raise ConfigError(f"--json: {text!r} is a folder; give a file name like "
                          f"{str(path / 'stats.json')!r}")
    direct = target.exists() and not target.is_file()
    writable = os.access(target, os.W_OK) if direct else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise ConfigError(f"--json: {text!r} is not writable; fix the permissions of the "
                          f"file or of its folder {str(folder)!r}, or pick another path")


def check_run_paths(written: Sequence[NamedPath], read: Sequence[NamedPath]) -> None:
    """Every written path is its own file: neither another written path nor a read one.

    Raises OutputPathError naming the written path's field, both spellings and the fix.
    Linear in the number of paths (a prompts file may give thousands of outputs).
    """
    seen: dict[tuple, NamedPath] = {}
    for field, path in read:
        seen.setdefault(_identity(path), (field, path))
    for field, path in written:
        key = _identity(path)
        if key in seen:
            raise OutputPathError(_collision(field, path, *seen[key]))
        seen[key] = (field, path)


def _collision(field: str, path, other_field: str, other) -> str:
    shown, other_shown = os.fspath(path), os.fspath(other)
    both = "" if shown == other_shown else f" (both are {str(_resolved(path))!r})"
    if field == other_field:  # two streams of one output template
        return (f"{field}: two streams would write one file, {other_shown!r} and {shown!r}"
                f"{both}; put {{index}} in the file name so each stream gets its own")
    reads = other_field in ("config", "rollout.prompts", "rollout.actions")
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


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))

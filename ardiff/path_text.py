"""Path strings checked on their own, before any file is touched; where a written one lands.

    check_path_text("--json", text)    # refuses '', ' ', NUL, '.', 'a/', '-', names too long
    landing("out.mp4")                 # (the file it names, links followed; a FIFO or device?)

A leaf below every layer: the writer, the config and the CLI all check paths the same way.
Every output is written where its path leads (docs/errors.md): through a symlink to its
target, which is replaced whole while the link stays; into a FIFO or a device as it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ardiff.errors import ConfigError, OutputPathError
from ardiff.limits import MAX_NAME_BYTES
from ardiff.text import path_problem, short_repr

EXAMPLE_NAMES = {"output.path": "out.mp4", "--json": "stats.json", "--report": "run.png",
                 "--plot": "bench.png", "--actions-out": "play.actions.yaml",
                 "rollout.prompts": "prompts.txt", "rollout.actions": "actions.yaml"}
WRITTEN_FIELDS = ("output.path", "--json", "--report", "--plot", "--actions-out")
STDOUT = "-"  # `--json -` alone means stdout; an output elsewhere named '-' is refused
_SEPARATORS = tuple({"/", os.sep, os.altsep} - {None})
_FOLDER_NAMES = ("", ".", "..")
# A written file goes through a hidden work file beside it: `.<name>.<pid>-<hex>.partial<ext>`
# for a video, `.<name>.<random>.partial` for --json. Room for that in one file name:
WORK_NAME_EXTRA_BYTES = 48
MAX_WRITTEN_NAME_BYTES = MAX_NAME_BYTES - WORK_NAME_EXTRA_BYTES


def check_path_text(field: str, text: str | os.PathLike, *, file_needed: bool = True) -> None:
    """Refuse a path string no file can have: empty, blank, with a NUL byte, too long (a name
    or the whole), or (where a file is needed) naming a folder: '.', '..' or ending in a
    separator; and an output typed as the str '-', which is not stdout (only `--json -`
    is; `Path('./-')`, a planned path, names a file '-').

    Raises OutputPathError for the outputs (WRITTEN_FIELDS), ConfigError for inputs.
    """
    raw = os.fspath(text)
    error = OutputPathError if field in WRITTEN_FIELDS else ConfigError
    example = EXAMPLE_NAMES.get(field, "name.ext")
    if text == STDOUT and field in WRITTEN_FIELDS and field != "--json":
        named, also = "file", ""
        if field == "output.path":
            named, also = "folder of PNG frames", ", or './-' to mean that folder"
        raise error(f"{field}: '-' is not stdout here (only --json - is): it would name a "
                    f"{named} called '-'; give a file name like {example!r}{also}")
    if not raw.strip():
        raise error(f"{field}: {raw!r} is {'empty' if not raw else 'blank'}; give a file "
                    f"name like {example!r}")
    if "\0" in raw:
        raise error(f"{field}: {raw!r} holds a NUL byte (\\0), which no file name can; "
                    f"remove it")
    if file_needed and (raw.endswith(_SEPARATORS) or Path(raw).name in _FOLDER_NAMES):
        raise error(f"{field}: {raw!r} names a folder, and a file is needed here; give a "
                    f"file name like {os.path.join(raw, example)!r}")
    name_bytes = len(Path(raw).name.encode("utf-8", "surrogateescape"))
    if error is OutputPathError and name_bytes > MAX_WRITTEN_NAME_BYTES:
        raise error(f"{field}: {short_repr(raw)} has a name of {name_bytes} bytes; it is "
                    f"written through a work file whose name adds up to "
                    f"{WORK_NAME_EXTRA_BYTES} bytes and file systems allow {MAX_NAME_BYTES}, "
                    f"so give a name of at most {MAX_WRITTEN_NAME_BYTES} bytes")
    try:
        problem = path_problem(raw)
    except UnicodeEncodeError:  # bytes that are not UTF-8 (argv's surrogateescape): the
        problem = None          # file system judges their length
    if problem:
        raise error(f"{field}: {short_repr(raw)} {problem}")


def check_not_a_loop(field: str, text: str | os.PathLike) -> None:
    """Refuse an output that is a loop of symlinks: it leads to no file, and writing "where
    it leads" would silently replace a link. Raises OutputPathError naming `field`."""
    raw = os.fspath(text)
    if os.path.islink(os.path.realpath(Path(raw).expanduser())):  # realpath stops in a loop
        raise OutputPathError(f"{field}: {short_repr(raw)} is a loop of symlinks (it leads to "
                              f"no file); remove the link or pick another path")


def landing(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where bytes written to `path` land: the file it names with `~` expanded and every
    symlink followed, and whether that is a stream (an existing FIFO or device node), which
    is written into as it is, never replaced. The kernel's walk decides (os.stat of the path
    as given): it follows /proc's fd links (/dev/stdout -> /proc/self/fd/1 -> a pipe or a
    terminal), which realpath cannot (it names 'pipe:[N]'); such a stream is the path itself."""
    expanded = Path(path).expanduser()
    real = Path(os.path.realpath(expanded))
    try:
        mode = os.stat(expanded).st_mode
    except OSError:
        return real, False
    stream = stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
    if stream and not os.path.exists(real):  # reached through a /proc fd link
        return Path(os.path.abspath(expanded)), True
    return real, stream

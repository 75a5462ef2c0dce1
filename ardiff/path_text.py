"""Path strings checked on their own, before any file is touched.

    check_path_text("--json", text)    # refuses '', ' ', NUL, '.', 'a/', names too long

A leaf below every layer: the writer, the config and the CLI all check paths the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from ardiff.errors import ConfigError, OutputPathError
from ardiff.limits import MAX_NAME_BYTES
from ardiff.text import short_repr

EXAMPLE_NAMES = {"output.path": "out.mp4", "--json": "stats.json",
             "rollout.prompts": "prompts.txt", "rollout.actions": "actions.yaml"}
_SEPARATORS = tuple({"/", os.sep, os.altsep} - {None})
_FOLDER_NAMES = ("", ".", "..")
# A written file goes through a hidden work file beside it: `.<name>.<pid>-<hex>.partial<ext>`
# for a video, `.<name>.<random>.partial` for --json. Room for that in one file name:
WORK_NAME_EXTRA_BYTES = 48
MAX_WRITTEN_NAME_BYTES = MAX_NAME_BYTES - WORK_NAME_EXTRA_BYTES


def check_path_text(field: str, text: str | os.PathLike, *, file_needed: bool = True) -> None:
    """Refuse a path string no file can have: empty, blank, with a NUL byte, or (where a file
    is needed) naming a folder: '.', '..' or ending in a separator.

    Raises OutputPathError for `output.path` and `--json`, ConfigError for inputs.
    """
    raw = os.fspath(text)
    error = OutputPathError if field in ("output.path", "--json") else ConfigError
    example = EXAMPLE_NAMES.get(field, "name.ext")
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



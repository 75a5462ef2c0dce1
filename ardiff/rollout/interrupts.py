"""Where a stop may land: an interrupt raised in the pipeline's code (or the libraries it
calls) abandons a block cleanly; one raised in ardiff's own bookkeeping (KV pages, sessions,
files) could cut it half-way. A signal handler asks `in_ardiffs_own_code(frame)` and, when
it is, tries again a moment later (`the CLI's StopSignals`, a rank's `RankSignals`)."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import NamedTuple


def in_ardiffs_own_code(frame: FrameType | None) -> bool:
    """Whether an exception raised in `frame` now would cut through ardiff's bookkeeping (KV
    pages, sessions, files), not the pipeline's code: the innermost frame that is neither
    torch's, numpy's nor the standard library's is ardiff's (not one of its shipped
    pipelines')."""
    roots = _CodeRoots.now()
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(roots.ardiff) and not path.startswith(roots.pipelines):
            return True
        if not roots.is_called(path):
            return False
        frame = frame.f_back
    return False


class _CodeRoots(NamedTuple):
    """Where code lives: ardiff's, its pipelines', and what a pipeline calls into."""

    ardiff: str
    pipelines: str
    libraries: tuple[str, ...]  # torch, numpy, frozen modules
    stdlib: str
    site: tuple[str, ...]       # third-party packages (a pipeline's own among them)

    @classmethod
    def now(cls) -> _CodeRoots:
        import sysconfig

        def folder(name: str) -> str:
            path = getattr(sys.modules.get(name), "__file__", None)
            return "\0" if path is None else os.path.dirname(path) + os.sep  # \0: no path

        paths = sysconfig.get_paths()
        ardiff = folder("ardiff")
        return cls(ardiff, f"{ardiff}pipelines{os.sep}", (folder("torch"), folder("numpy"), "<"),
                   paths["stdlib"] + os.sep, (paths["purelib"] + os.sep, paths["platlib"] + os.sep))

    def is_called(self, path: str) -> bool:
        return path.startswith(self.libraries) or (path.startswith(self.stdlib)
                                                   and not path.startswith(self.site))

"""ardiff's optional extras (pyproject.toml's optional-dependencies), for one-line errors.

    missing_extra_message(exc)   # "needs the 'wan' extra (diffusers is not installed): pip
                                 #  install 'ardiff[wan]'", or None for another module

The extras are read from the installed ardiff's metadata, so the list lives in one place.
A distribution's import name is its name lowercased with `-` as `_` (true of every package
an extra installs: prometheus-client -> prometheus_client).
"""

from __future__ import annotations

import re

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def extras_by_module() -> dict[str, str]:
    """Import name -> the extra that installs it (the first extra naming it)."""
    import importlib.metadata  # only when an import failed: `ardiff --help` stays light

    try:
        requires = importlib.metadata.requires("ardiff") or []
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return {}
    found: dict[str, str] = {}
    for line in requires:
        extra, name = _EXTRA_MARKER.search(line), _NAME.match(line)
        if extra and name:
            found.setdefault(name.group(1).lower().replace("-", "_").replace(".", "_"),
                             extra.group(1))
    return found


def missing_extra_message(exc: ModuleNotFoundError, what: str = "this") -> str | None:
    """The one line for an import that failed because an extra is not installed, naming the
    install; None when the missing module belongs to no extra (a real bug or typo)."""
    top = (exc.name or "").split(".")[0]
    extra = extras_by_module().get(top)
    if extra is None:
        return None
    return (f"{what} needs the '{extra}' extra ({top} is not installed): "
            f"pip install 'ardiff[{extra}]'")

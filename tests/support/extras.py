"""The one way a test that needs an optional extra skips without it, naming the extra.

    pytestmark = pytest.mark.extra("wan")     # a module's tests, or one test's decorator
    require_extra("wan")                       # at module top, before importing the extra

An extra's packages are read from the installed ardiff's metadata (pyproject.toml's
optional-dependencies: one list, not a second copy here). A [test]-only install, what
README.md tells a newcomer to run, skips these tests and only these, each with the reason
`extra_skip_reason` gives (tests/test_extras.py holds the suite to that).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HIDDEN: set[str] = set()   # distributions treated as missing (`hide_extras`)


def extra_packages(extra: str) -> list[str]:
    """The distributions ardiff's optional extra `extra` installs."""
    names = []
    for line in importlib.metadata.requires("ardiff") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            names.append(requirement.name)
    if not names:
        raise ValueError(f"extra {extra!r}: pyproject.toml has no such optional dependency")
    return names


def missing_extra_packages(*extras: str) -> list[str]:
    """The packages of `extras` that are not installed (empty: the test can run)."""
    missing = []
    for extra in extras:
        for name in extra_packages(extra):
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(name)
            else:
                if canonicalize_name(name) in HIDDEN:
                    missing.append(name)
    return missing


def extra_skip_reason(extra: str, missing: list[str]) -> str:
    """The one skip reason of a missing extra."""
    return (f"needs the '{extra}' extra ({', '.join(missing)} missing): "
            f"pip install 'ardiff[{extra}]'")


def require_extra(*extras: str) -> None:
    """Skip the calling module unless every one of `extras` is installed (call it before
    importing them)."""
    for extra in extras:
        missing = missing_extra_packages(extra)
        if missing:
            pytest.skip(extra_skip_reason(extra, missing), allow_module_level=True)


def hide_extras() -> set[str]:
    """Make this process look like a [test]-only install: every distribution that only the
    extras bring (their requirements, transitively, less what the core and `test` need) is
    missing to `missing_extra_packages`, and importing one of its modules raises
    ModuleNotFoundError. Returns the hidden distributions (`pytest --without-extras`)."""
    extras = [name for name in importlib.metadata.metadata("ardiff").get_all("Provides-Extra")
              or [] if name != "test"]
    needed = _closure(_ardiff_requirements(["test"]))
    HIDDEN.update(_closure(_ardiff_requirements(extras)) - needed)
    modules = {module for module, dists in importlib.metadata.packages_distributions().items()
               if {canonicalize_name(d) for d in dists} <= HIDDEN}
    sys.meta_path.insert(0, _Blocker(modules))
    return set(HIDDEN)


def _ardiff_requirements(extras: list[str]) -> list[str]:
    """ardiff's requirements for a plain install plus `extras`."""
    names = []
    for line in importlib.metadata.requires("ardiff") or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras):
            names.append(requirement.name)
    return names


def _closure(names: list[str]) -> set[str]:
    """The installed distributions `names` pull in, themselves included (canonical names)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses to import the hidden distributions' modules, as a [test]-only install would."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.modules:
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden: --without-extras)",
                                      name=fullname)
        return None

"""A test that needs an optional extra skips without it, naming the extra, and nothing else
skips for a missing package: what README.md's `pip install '.[test]'` + `pytest -q` sees
(`tests/support/extras.py`; .ci/run also runs exactly that, in a fresh venv)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import extras
import pytest

ROOT = Path(__file__).parent.parent
REASON = re.compile(r"needs the '(\w+)' extra \(([\w., -]+) missing\): pip install 'ardiff\[\1\]'")
# What else may skip a test: a device, a checkout or a system tool this machine lacks, never a
# pip package.
OTHER_REASONS = re.compile(r"CUDA|set ARDIFF_\w+ to a checkout|/dev/full|chromium|root|tmpfs|"
                           r"torchrun|fork|statm")


def test_a_missing_extra_skips_with_its_name_and_the_install_line(monkeypatch):
    monkeypatch.setattr(extras, "HIDDEN", {"matplotlib"})
    assert extras.missing_extra_packages("plot") == ["matplotlib"]
    reason = extras.extra_skip_reason("plot", ["matplotlib"])
    assert reason == ("needs the 'plot' extra (matplotlib missing): "
                      "pip install 'ardiff[plot]'")
    assert REASON.fullmatch(reason)


def test_an_installed_extra_is_not_missing_and_an_unknown_one_is_an_error():
    assert extras.missing_extra_packages() == []
    with pytest.raises(ValueError, match="extra 'gpu': pyproject.toml has no such"):
        extras.extra_packages("gpu")


def test_every_extra_the_tests_name_is_declared():
    declared = set(importlib.metadata.metadata("ardiff").get_all("Provides-Extra") or [])
    named = set()
    for path in (ROOT / "tests").rglob("*.py"):
        named.update(re.findall(r"(?:mark\.extra|require_extra)\(\"(\w+)\"", path.read_text()))
    assert named and named <= declared, named - declared


@pytest.mark.heavy
def test_a_test_only_install_skips_only_for_named_extras():
    """The default suite with every package only the extras bring hidden (`--without-extras`):
    it passes, and every skip names an extra or a device, checkout or tool that is missing."""
    # The pytest script, not `python -m pytest`: that would put the source tree on sys.path
    # ahead of the installed ardiff.
    pytest_script = Path(sys.executable).with_name("pytest")
    run = subprocess.run([str(pytest_script), "-q", "-rs", "--without-extras",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    reasons = [line.split(": ", 1)[1] for line in skips]
    assert any(REASON.fullmatch(reason) for reason in reasons), "nothing skipped for an extra"
    strays = [r for r in reasons if not (REASON.fullmatch(r) or OTHER_REASONS.search(r))]
    assert not strays, strays

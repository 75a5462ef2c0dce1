"""docs/python.md: every Python example on the page runs as written (the notebook path)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
EXAMPLE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples() -> list[str]:
    return EXAMPLE.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_examples() -> None:
    assert len(examples()) >= 2


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the examples write nothing: an empty folder shows it
    exec(compile(examples()[index], f"docs/python.md example {index}", "exec"), {})
    assert list(tmp_path.iterdir()) == []
    if "print(error)" in examples()[index]:
        assert "'jump' is not an action of this pipeline" in capsys.readouterr().out

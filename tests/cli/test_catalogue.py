"""The bad-input catalogue: every way to get the input of `ardiff` wrong, and what it says.

Each case runs `ardiff rollout run.yaml ARGS` (or `inspect-spec` / `warmup`) in a folder
holding only its inputs: run.yaml (a tiny working config unless the case changes it),
the test pipelines (tests/support/fault_pipelines.py, tests/support/spec_pipelines.py,
copied beside it so entries and messages read like a user's) and the case's own files.
Every case must

- exit with its code (2 bad usage/config/spec, 3 does not fit, 1 the pipeline's load failed),
- print exactly one line, `error: ...`, that matches its pattern: the field, the value,
  the rule and the fix; no traceback (in-process: no exception escaped Typer),
- create nothing (no video, no partial file, no stats).

The table "Bad input" in docs/errors.md is these cases with their real messages
(the folder's path cut off): `test_the_errors_page_table_is_the_catalogue` prints the table
to paste when they differ. The cases themselves are the table in
tests/support/catalogue_cases.py. Every case runs once in-process (Typer's runner, the
`outcomes` fixture); the SUBPROCESS ones (two: the first exit and the deepest, a spec
that does not fit) also through the installed command, in a subprocess marked slow.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from ardiff_cli.main import app

REPO = Path(__file__).resolve().parents[2]
ERRORS_PAGE = REPO / "docs" / "errors.md"
INPUT_FILES = (REPO / "tests" / "support" / "fault_pipelines.py",
               REPO / "tests" / "support" / "spec_pipelines.py")
ARDIFF = shutil.which("ardiff", path=str(Path(sys.executable).parent)) or shutil.which("ardiff")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
ENV.pop("FORCE_COLOR", None)

TABLE_HEADER = "| bad input | exit | message |"
TABLE_RULE = "|---|---|---|"

from catalogue_cases import BASE, CASES, NO_CUDA, READ_ONLY, Case
from extras import extra_skip_reason, missing_extra_packages

SUBPROCESS = [case for case in CASES if case.subprocess]


# -- running a case ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What one run of a case did."""

    exit_code: int
    stdout: str
    stderr: str
    crashed: bool          # an exception escaped the command (in-process)
    created: list[str]     # paths that were not there before

    @property
    def tracebacks(self) -> int:
        return (self.stdout + self.stderr).count("Traceback") + self.crashed


def merged(base: dict, change: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def prepare(case: Case, folder: Path) -> list[str]:
    """Write the case's inputs into `folder`; return the command line after `ardiff`."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in INPUT_FILES:
        shutil.copy(source, folder)
    config = case.config
    if config is None or isinstance(config, dict):
        config = yaml.safe_dump(merged(BASE, config or {}), sort_keys=False)
    write(folder / "run.yaml", config)
    for name, content in case.files:
        write(folder / name, content)
    if case.needs == READ_ONLY:
        (folder / READ_ONLY).mkdir()
        (folder / READ_ONLY).chmod(stat.S_IRUSR | stat.S_IXUSR)
    return [case.command, case.config_arg, *case.args]


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def can_run(case: Case) -> bool:
    return skip_reason(case) is None


def skip_reason(case: Case) -> str | None:
    """Why this machine cannot run the case (None: it can)."""
    if case.needs == NO_CUDA and torch.cuda.is_available():
        return "CUDA is available here"
    missing = missing_extra_packages(case.extra) if case.extra else []
    return extra_skip_reason(case.extra, missing) if missing else None


def deny_writes_to(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root ignores folder modes: make os.access say what it would say to anyone else."""
    real_access, target = os.access, folder.resolve()

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and Path(path).resolve() == target:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def run_in_process(case: Case, folder: Path) -> Outcome:
    args = prepare(case, folder)
    before = listing(folder)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(folder)
        if case.needs == READ_ONLY and os.access(folder / READ_ONLY, os.W_OK):
            deny_writes_to(folder / READ_ONLY, monkeypatch)
        result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    return Outcome(result.exit_code, result.stdout, result.stderr, crashed,
                   sorted(listing(folder) - before))


def run_installed(case: Case, folder: Path) -> Outcome:
    assert ARDIFF, "the ardiff command is not installed next to this Python"
    args = prepare(case, folder)
    before = listing(folder)
    proc = subprocess.run([ARDIFF, *args], cwd=folder, env=ENV, capture_output=True, text=True,
                          timeout=120)
    return Outcome(proc.returncode, proc.stdout, proc.stderr, False,
                   sorted(listing(folder) - before))


def message(outcome: Outcome, folder: Path) -> str:
    """The one error line without `error: `, with the case folder's path cut off."""
    line = outcome.stderr.strip().removeprefix("error: ")
    for prefix in sorted({str(folder), str(folder.resolve())}, key=len, reverse=True):
        line = line.replace(prefix + os.sep, "").replace(prefix, ".")
    return line


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[Outcome, Path]]:
    """Every case that can run here, run once in-process, each in its own folder."""
    root = tmp_path_factory.mktemp("catalogue")
    runs = {}
    for case in CASES:
        if can_run(case):
            folder = root / case.id
            runs[case.id] = (run_in_process(case, folder), folder)
    return runs


def assert_refused(case: Case, outcome: Outcome, folder: Path) -> None:
    assert outcome.tracebacks == 0, outcome.stderr
    assert outcome.exit_code == case.code, outcome.stderr
    assert outcome.stdout == ""
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
    assert re.search(case.pattern, message(outcome, folder)), lines[0]
    assert outcome.created == [], f"created {outcome.created}"


# -- the tests ---------------------------------------------------------------------------------
def test_case_names_are_unique():
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_bad_input_exits_with_its_code_and_one_line_that_names_the_fix(case, outcomes):
    if not can_run(case):
        pytest.skip(skip_reason(case))
    outcome, folder = outcomes[case.id]
    assert_refused(case, outcome, folder)


def test_the_whole_catalogue_shows_no_traceback_and_creates_no_file(outcomes):
    runs = [outcome for outcome, _folder in outcomes.values()]
    assert len(runs) == sum(map(can_run, CASES))
    assert sum(outcome.tracebacks for outcome in runs) == 0
    assert [outcome.created for outcome in runs if outcome.created] == []
    assert {outcome.exit_code for outcome in runs} <= {1, 2, 3}


@pytest.mark.heavy  # a fresh process per case (3 s each): keeps pytest -q under 90 s
@pytest.mark.parametrize("case", SUBPROCESS, ids=lambda case: case.id)
def test_the_installed_command_says_the_same(case, outcomes, tmp_path):
    if not can_run(case):
        pytest.skip(skip_reason(case))
    outcome = run_installed(case, tmp_path)

    assert_refused(case, outcome, tmp_path)
    in_process, folder = outcomes[case.id]
    assert message(outcome, tmp_path) == message(in_process, folder)


def test_the_errors_page_table_is_the_catalogue(outcomes):
    """docs/errors.md lists every case in order, with its code and its real message."""
    rows = page_rows()
    expected = [table_row(case, outcomes) for case in CASES]
    table = "\n".join([TABLE_HEADER, TABLE_RULE, *expected])
    assert len(rows) == len(CASES), f"docs/errors.md's catalogue differs; the table is:\n{table}"
    for case, row, want in zip(CASES, rows, expected):
        problem, code, example = row
        assert (problem, code) == (case.problem, str(case.code)), f"the table is:\n{table}"
        if case.exact and case.id in outcomes:
            assert row == split_row(want), f"docs/errors.md's row differs; the table is:\n{table}"
        else:
            assert re.search(case.pattern, example.strip("`").replace("\\|", "|")), row


def table_row(case: Case, outcomes: dict) -> str:
    if case.id in outcomes:
        outcome, folder = outcomes[case.id]
        text = message(outcome, folder)
    else:
        text = "(not run here)"
    assert "`" not in text
    return f"| {case.problem} | {case.code} | `{text.replace('|', chr(92) + '|')}` |"


def split_row(line: str) -> tuple[str, ...]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return tuple(cell.strip() for cell in cells)


def page_rows() -> list[tuple[str, ...]]:
    lines = ERRORS_PAGE.read_text(encoding="utf-8").splitlines()
    assert TABLE_HEADER in lines, f"docs/errors.md has no table starting {TABLE_HEADER!r}"
    start = lines.index(TABLE_HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(split_row(line))
    return rows


# -- inputs that once crashed with a traceback, and now work -------------------------------------
def test_braces_other_than_index_stay_in_output_names(tmp_path, monkeypatch):
    args = prepare(Case("", 0, ""), tmp_path)
    monkeypatch.chdir(tmp_path)

    result = CliRunner().invoke(app, [*args, "-o", "out-{index}-{take}.npy", "--quiet",
                                      "--set", "rollout.prompts=[a, b]"])

    assert result.exit_code == 0, result.output
    assert (tmp_path / "out-0-{take}.npy").is_file() and (tmp_path / "out-1-{take}.npy").is_file()

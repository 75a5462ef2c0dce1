"""The bad-input catalogue: every way to get the input of `ardiff` wrong, and what it says.

Each case runs `ardiff rollout run.yaml ARGS` (or `inspect-spec` / `warmup`) in a folder
holding only its inputs: run.yaml (a tiny working config unless the case changes it),
the test pipelines (tests/pipelines/fault_pipelines.py, tests/fixtures/spec_pipelines.py,
copied beside it so entries and messages read like a user's) and the case's own files.
Every case must

- exit with its code (2 bad usage/config/spec, 3 does not fit, 1 the pipeline's load failed),
- print exactly one line, `error: ...`, that matches its pattern: the field, the value,
  the rule and the fix; no traceback (in-process: no exception escaped Typer),
- create nothing (no video, no partial file, no stats).

The table "Errors and exit codes" in README.md is these cases with their real messages
(the folder's path cut off): `test_the_readme_table_is_the_catalogue` prints the table to
paste when they differ. Every case runs once in-process (Typer's runner, the `outcomes`
fixture); the SUBPROCESS ones also through the installed command.
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

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
INPUT_FILES = (REPO / "tests" / "pipelines" / "fault_pipelines.py",
               REPO / "tests" / "fixtures" / "spec_pipelines.py")
ARDIFF = shutil.which("ardiff", path=str(Path(sys.executable).parent)) or shutil.which("ardiff")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
ENV.pop("FORCE_COLOR", None)

BASE = {"pipeline": {"entry": "fault_pipelines.py:FaultPipeline", "args": {}},
        "runtime": {"device": "cpu", "memory_budget": "16MiB"},
        "rollout": {"frames": 4, "prompt": "a red ball"},
        "output": {"path": "out.mp4", "fps": 8}}
READ_ONLY = "ro"          # the folder of the "not writable" case
NO_CUDA = "no-cuda"       # a case that needs a machine without CUDA
TABLE_HEADER = "| bad input | exit | message |"
TABLE_RULE = "|---|---|---|"


@dataclass(frozen=True)
class Case:
    """One bad input: what is wrong, the exit code and a regex the `error:` line matches."""

    problem: str                  # the README row
    code: int
    pattern: str                  # searched in the message (after "error: ")
    args: tuple[str, ...] = ()    # after `ardiff COMMAND CONFIG`
    config: dict | str | bytes | None = None  # a dict merges into BASE; str/bytes: the file
    files: tuple[tuple[str, str | bytes], ...] = ()  # more inputs beside run.yaml
    command: str = "rollout"
    config_arg: str = "run.yaml"
    needs: str | None = None      # READ_ONLY or NO_CUDA
    exact: bool = True            # False: the message has machine-specific text
    subprocess: bool = False      # also run through the installed command

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.problem.lower()).strip("-")


def entry(value: str, **args) -> dict:
    return {"pipeline": {"entry": value, "args": args}}


def args_of(**args) -> dict:
    return {"pipeline": {"args": args}}


def rollout(**values) -> dict:
    return {"rollout": values}


CASES = [
    # -- the config file --------------------------------------------------------------------
    Case("config file missing", 2, r"^config: 'nope\.yaml' does not exist or is not a file; "
         r"check the path", config_arg="nope.yaml", subprocess=True),
    Case("config file not UTF-8", 2, r"^config: cannot read 'run\.yaml' \(UnicodeDecodeError: "
         r".*\); give a UTF-8 YAML file", config=b"pipeline: \xff\xfe\n"),
    Case("YAML syntax error", 2, r"^run\.yaml: YAML syntax error at line 3, column 2: .*; fix "
         r"the YAML there", config="pipeline:\n  entry: fault_pipelines.py:FaultPipeline\n"
         " args: {}\n", subprocess=True),
    Case("top level not a mapping", 2, r"^run\.yaml: the top level must be a mapping of "
         r"sections \(pipeline, runtime, \.\.\.\), got list", config="- pipeline\n- runtime\n"),
    Case("required key missing", 2, r"^pipeline: required key is missing; add it",
         config="rollout: {frames: 4}\n"),
    Case("unknown key", 2, r"^rollout\.frams: unknown key; did you mean 'frames'\?",
         config=rollout(frams=4)),
    Case("unknown section", 2, r"^video: unknown key; known keys: pipeline, runtime, warmup, "
         r"rollout, output", config={"video": {"fps": 8}}),
    Case("wrong type", 2, r"^rollout\.frames: expected an integer, got 'many' \(str\)",
         config=rollout(frames="many")),
    Case("wrong type of section", 2, r"^runtime: expected a mapping of keys, got 'cpu' \(str\)",
         config={"runtime": "cpu"}),
    Case("value not one of the choices", 2, r"^runtime\.kv\.backend: 'flat' \(str\) is not "
         r"allowed; use one of 'paged', 'dense'", config={"runtime": {"kv": {"backend": "flat"}}}),
    Case("prompt schedule not starting at frame 0", 2, r"^rollout\.prompt: a schedule must "
         r"start at frame 0, got frames \[8\]; add \{frame: 0",
         config=rollout(prompt=[{"frame": 8, "prompt": "a"}])),
    # -- counts and sizes -------------------------------------------------------------------
    Case("`--frames 0`", 2, r"^rollout\.frames: 0 is invalid; it must be > 0",
         args=("--frames", "0"), subprocess=True),
    Case("`--frames -3`", 2, r"^rollout\.frames: -3 is invalid; it must be > 0",
         args=("--frames", "-3")),
    Case("zero sessions", 2, r"^runtime\.max_sessions: 0 is invalid; it must be > 0",
         config={"runtime": {"max_sessions": 0}}),
    Case("zero window", 2, r"^runtime\.kv\.window_frames: 0 is invalid; it must be > 0",
         args=("--set", "runtime.kv.window_frames=0")),
    Case("negative sink", 2, r"^runtime\.kv\.sink_frames: -1 is invalid; it must be >= 0",
         config={"runtime": {"kv": {"sink_frames": -1}}}),
    Case("zero denoising steps", 2, r"^rollout\.num_steps: 0 is invalid; it must be > 0",
         config=rollout(num_steps=0)),
    Case("`--fps 0`", 2, r"^output\.fps: 0\.0 must be > 0; try 16", args=("--fps", "0")),
    Case("malformed size", 2, r"^runtime\.memory_budget: 'lots' is not a size; write bytes like "
         r"6GiB", args=("--budget", "lots")),
    Case("unknown size unit", 2, r"^runtime\.memory_budget: '12XB' has unknown unit 'XB'; use "
         r"one of B, KB", args=("--budget", "12XB")),
    Case("zero budget", 2, r"^runtime\.memory_budget: '0' must be more than 0 bytes",
         args=("--budget", "0")),
    Case("budget neither fraction nor bytes", 2, r"^runtime\.memory_budget: 1\.5 is neither a "
         r"fraction in \(0, 1\] nor a whole number of bytes", config={"runtime": {
             "memory_budget": 1.5}}),
    # -- the pipeline entry point and its spec --------------------------------------------
    Case("entry module missing", 2, r"^pipeline\.entry: module 'no_such_module' not found; "
         r"check the spelling or install", config=entry("no_such_module:Pipeline"),
         subprocess=True),
    Case("entry file missing", 2, r"^pipeline\.entry: file 'missing\.py' not found \(paths are "
         r"relative to the config file's folder", config=entry("missing.py:Pipeline")),
    Case("entry attribute missing", 2, r"^pipeline\.entry: '.*fault_pipelines\.py' has no "
         r"attribute 'Nope'; it defines: .*FaultPipeline",
         config=entry("fault_pipelines.py:Nope"), exact=False),
    Case("entry malformed", 2, r"^pipeline\.entry: ':Pipeline' is malformed; write "
         r"package\.module:attr", config=entry(":Pipeline")),
    Case("entry not a registered name", 2, r"^pipeline\.entry: 'no-such-model' is not a "
         r"registered pipeline \(known: .*\); use package\.module:attr",
         config=entry("no-such-model"), exact=False),
    Case("entry not callable", 2, r"^pipeline\.entry: 'spec_pipelines\.py:NOT_CALLABLE' is a "
         r"int, not a class or factory", config=entry("spec_pipelines.py:NOT_CALLABLE")),
    Case("entry file raises on import", 2, r"^pipeline\.entry: running 'broken\.py' raised "
         r"ImportError: this model needs flash_attn", config=entry("broken.py:Pipeline"),
         files=(("broken.py", "raise ImportError('this model needs flash_attn')\n"),)),
    Case("constructor raises", 2, r"^pipeline: constructing "
         r"'spec_pipelines\.py:ConstructorRaisesPipeline' with args \{\} raised ValueError: no "
         r"such checkpoint", config=entry("spec_pipelines.py:ConstructorRaisesPipeline")),
    Case("unknown pipeline argument", 2, r"^pipeline: constructing "
         r"'fault_pipelines\.py:FaultPipeline' with args \{'colour': 3\} raised TypeError: "
         r".*unexpected keyword argument 'colour'", args=("--set", "pipeline.args.colour=3")),
    Case("object lacks protocol methods", 2, r"^pipeline: "
         r"'spec_pipelines\.py:MissingMethodsPipeline' built a MissingMethodsPipeline that lacks "
         r"generate_block, close_ar_diffusion_session; implement SupportsARDiffusionPipeline",
         config=entry("spec_pipelines.py:MissingMethodsPipeline")),
    Case("bad video_frames_per_latent_frame", 2, r"^pipeline: video_frames_per_latent_frame is "
         r"0; it must be an integer >= 1", config=args_of(video_frames_per_latent_frame=0)),
    Case("invalid spec", 2, r"^spec\.num_layers: 0 is invalid; it must be an integer > 0",
         config=entry("spec_pipelines.py:InvalidSpecPipeline")),
    Case("invalid spec from pipeline args", 2, r"^pipeline: constructing "
         r"'fault_pipelines\.py:FaultPipeline' with args \{'frames_per_block': 0\} raised "
         r"SpecError: spec\.frames_per_block: 0 is invalid; it must be an integer > 0",
         config=args_of(frames_per_block=0)),
    Case("spec method raises", 2, r"^pipeline: get_ar_diffusion_kv_cache_spec\(\) raised "
         r"RuntimeError: geometry unknown before load",
         config=entry("spec_pipelines.py:SpecRaisesPipeline")),
    Case("spec method returns no spec", 2, r"^pipeline: get_ar_diffusion_kv_cache_spec\(\) "
         r"returned a dict; it must return an ARDiffusionKVCacheSpec",
         config=entry("spec_pipelines.py:WrongSpecTypePipeline")),
    Case("rollout longer than max_model_len", 2, r"^rollout\.frames: 20 frames need 10 blocks "
         r"in a row, frame positions up to 20, but the pipeline's max_model_len is 8; lower "
         r"rollout\.frames to 8", args=("--frames", "20"), config=args_of(max_model_len=8)),
    Case("interleaved prompts do not fit", 2, r"^rollout\.interleave: 3 prompts need 3 resident "
         r"sessions but the memory plan fits 2; raise runtime\.memory_budget",
         config=rollout(prompts=["a", "b", "c"], interleave=True)),
    Case("the pipeline's load raises", 1, r"^pipeline: load\('cpu', float32\) raised "
         r"InjectedFault: checkpoint /models/missing\.safetensors not found",
         config=args_of(fault="load")),
    # -- --set --------------------------------------------------------------------------------
    Case("`--set` without `=`", 2, r"^--set: 'novalue' is not KEY=VALUE; write e\.g\. --set "
         r"runtime\.kv\.window_frames=12", args=("--set", "novalue")),
    Case("`--set` into a value", 2, r"^--set rollout\.frames\.x: rollout\.frames is a value, not "
         r"a section; it cannot hold 'x'", args=("--set", "rollout.frames.x=3")),
    Case("`--set` unknown key", 2, r"^runtime\.kv\.windw_frames: unknown key; did you mean "
         r"'window_frames'\?", args=("--set", "runtime.kv.windw_frames=3")),
    Case("`--set` bad value", 2, r"^rollout\.seed: expected an integer, got 'abc' \(str\)",
         args=("--set", "rollout.seed=abc")),
    # -- the output ---------------------------------------------------------------------------
    Case("output folder missing", 2, r"^output\.path: 'missing/out\.mp4' is in a folder that "
         r"does not exist \('missing'\); create it first", args=("-o", "missing/out.mp4")),
    Case("output folder not writable", 2, r"^output\.path: 'ro/out\.mp4' is in a folder that is "
         r"not writable \('ro'\); fix its permissions", args=("-o", "ro/out.mp4"),
         needs=READ_ONLY),
    Case("output PNG folder is a file", 2, r"^output\.path: 'frames' is an existing file, and a "
         r"path without a suffix means a folder of PNG frames; add a suffix",
         args=("-o", "frames"), files=(("frames", "not a folder\n"),)),
    Case("unsupported extension", 2, r"^output\.path: 'out\.avi' has an unsupported suffix "
         r"'\.avi'; use one of \.mp4, \.mkv", args=("-o", "out.avi")),
    Case("codec not of the format", 2, r"^output\.codec: 'libx265' is not a codec for \.mp4 "
         r"files; use one of libx264", args=("--set", "output.codec=libx265")),
    Case("crf out of range", 2, r"^output\.crf: 99 is out of range for libx264 \(0\.\.51\); try "
         r"23", args=("--set", "output.crf=99")),
    Case("unknown x264 preset", 2, r"^output\.preset: 'turbo' is not an x264 preset; use one of "
         r"ultrafast", args=("--set", "output.preset=turbo")),
    Case("`--json` folder missing", 2, r"^--json: 'missing/stats\.json' is in a folder that does "
         r"not exist \('missing'\); create it first", args=("--json", "missing/stats.json")),
    Case("`--json` not writable", 2, r"^--json: 'ro/stats\.json' is not writable; fix the "
         r"permissions of the file or of its folder 'ro', or pick another path",
         args=("--json", "ro/stats.json"), needs=READ_ONLY),
    Case("`--json` names a folder", 2, r"^--json: 'stats' is a folder; give a file name like "
         r"'stats/stats\.json'", args=("--json", "stats"), files=(("stats/.keep", ""),)),
    # -- device, dtype, memory ----------------------------------------------------------------
    Case("unknown device", 2, r"^runtime\.device: 'tpu' is not a device; use cpu, cuda, cuda:N "
         r"or auto", args=("--device", "tpu")),
    Case("unknown dtype", 2, r"^runtime\.dtype: 'fp8' \(str\) is not allowed; use one of "
         r"'float32', 'bfloat16', 'float16'", args=("--dtype", "fp8")),
    Case("CUDA requested where none exists", 2, r"^runtime\.device: 'cuda' was requested but "
         r"CUDA is not available on this machine; use --device cpu", args=("--device", "cuda"),
         needs=NO_CUDA, subprocess=True),
    Case("budget too small for one session", 3, r"^runtime\.memory_budget: 100B cannot hold one "
         r"session \(needs 1\.2KiB: 768B per session \+ 512B shared, short by 1\.2KiB\); "
         r"raise the budget to at least 1\.2KiB",
         args=("--budget", "100"), subprocess=True),
    Case("budget too small (`inspect-spec`)", 3, r"^runtime\.memory_budget: 100B cannot hold "
         r"one session", args=("--budget", "100"), command="inspect-spec"),
    Case("budget too small (`warmup`)", 3, r"^runtime\.memory_budget: 100B cannot hold one "
         r"session", args=("--budget", "100"), command="warmup"),
    # -- prompt and action files --------------------------------------------------------------
    Case("prompts file missing", 2, r"^rollout\.prompts: cannot read 'nope\.txt' "
         r"\(FileNotFoundError: .*\); give a UTF-8 text file with one prompt per line",
         args=("--prompts", "nope.txt")),
    Case("prompts file empty", 2, r"^rollout\.prompts: 'prompts\.txt' has no prompts; write one "
         r"per line", args=("--prompts", "prompts.txt"),
         files=(("prompts.txt", "# nothing yet\n\n"),)),
    Case("prompts file not UTF-8", 2, r"^rollout\.prompts: cannot read 'prompts\.txt' "
         r"\(UnicodeDecodeError: .*\); give a UTF-8 text file", args=("--prompts", "prompts.txt"),
         files=(("prompts.txt", b"\xff\xfe a cat\n"),)),
    Case("actions file missing", 2, r"^rollout\.actions: cannot read 'nope\.yaml' "
         r"\(FileNotFoundError\); give a UTF-8 YAML file with a list of actions",
         args=("--actions", "nope.yaml")),
    Case("actions file not UTF-8", 2, r"^rollout\.actions: cannot read 'actions\.yaml' "
         r"\(UnicodeDecodeError\); give a UTF-8 YAML file", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", b"- \xff\xfe\n"),)),
    Case("actions file YAML syntax error", 2, r"^rollout\.actions \(actions\.yaml\): YAML syntax "
         r"error at line 2, column 1; fix the file", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "actions: [left\n"),)),
    Case("actions file not a list", 2, r"^rollout\.actions \(actions\.yaml\): expected a "
         r"non-empty list of actions, got 'left'", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "left\n"),)),
    Case("actions file entry not an action", 2, r"^rollout\.actions \(actions\.yaml\)\[1\]: 3 is "
         r"not an action; use a name like left", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "- left\n- 3\n"),)),
]
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
    return not (case.needs == NO_CUDA and torch.cuda.is_available())


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
        pytest.skip("CUDA is available here")
    outcome, folder = outcomes[case.id]
    assert_refused(case, outcome, folder)


def test_the_whole_catalogue_shows_no_traceback_and_creates_no_file(outcomes):
    runs = [outcome for outcome, _folder in outcomes.values()]
    assert len(runs) >= len(CASES) - 1  # all but the CUDA case on a CUDA machine
    assert sum(outcome.tracebacks for outcome in runs) == 0
    assert [outcome.created for outcome in runs if outcome.created] == []
    assert {outcome.exit_code for outcome in runs} <= {1, 2, 3}


@pytest.mark.parametrize("case", SUBPROCESS, ids=lambda case: case.id)
def test_the_installed_command_says_the_same(case, outcomes, tmp_path):
    if not can_run(case):
        pytest.skip("CUDA is available here")
    outcome = run_installed(case, tmp_path)

    assert_refused(case, outcome, tmp_path)
    in_process, folder = outcomes[case.id]
    assert message(outcome, tmp_path) == message(in_process, folder)


def test_the_readme_table_is_the_catalogue(outcomes):
    """README.md lists every case in order, with its code and its real message."""
    rows = readme_rows()
    expected = [table_row(case, outcomes) for case in CASES]
    table = "\n".join([TABLE_HEADER, TABLE_RULE, *expected])
    assert len(rows) == len(CASES), f"README.md's catalogue differs; the table is:\n{table}"
    for case, row, want in zip(CASES, rows, expected):
        problem, code, example = row
        assert (problem, code) == (case.problem, str(case.code)), f"the table is:\n{table}"
        if case.exact and case.id in outcomes:
            assert row == split_row(want), f"README.md's row differs; the table is:\n{table}"
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


def readme_rows() -> list[tuple[str, ...]]:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert TABLE_HEADER in lines, f"README.md has no table starting {TABLE_HEADER!r}"
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

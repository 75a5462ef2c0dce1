"""One rank of a parallel job breaks, or its parent does: the job's status, exit code and one
error line say which rank and why, the stats pass STATS_SCHEMA, every finished frame is in a
file and no process is left (RANK_FAULTS in tests/support/fault_cases.py; the "Parallel jobs"
table of docs/errors.md is that list).

Every case is the installed `ardiff rollout` (its own forkserver and ranks), broken from here:
a signal to one rank's pid (read from the marker file RankFaultDiT writes per rank), to the
parent, a missing weights file, torchrun's variables with no peer or a taken port. One
module-scoped run per case; each takes seconds of torch import, so every test that reads
them is heavy (the docs check alone runs by default).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from fault_cases import RANK_FAULTS, RANK_TABLE_HEADER, TABLE_RULE, RankFault

from ardiff.rollout.report import STATS_SCHEMA

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
ERRORS_PAGE = REPO / "docs" / "errors.md"
BIN = Path(sys.executable).parent
ENTRY = f"{SUPPORT / 'rank_pipelines.py'}:RankFaultDiT"
PROMPTS = ["a red ball", "a blue cube", "a green cone", "a cat"]
TINY = {"frames_per_block": 3, "window_frames": 6, "sink_frames": 1, "dim": 32,
        "num_layers": 1, "latent_size": 8, "upscale": 2}
FRAMES = 60            # 20 blocks of 3 frames per stream
BLOCK_SLEEP_S = 0.1    # so that a signal finds the ranks mid-rollout
WAIT_S = 120           # a run that takes longer than this hangs: the test fails
GONE_S = 30            # processes of a job whose parent was killed must be gone by then
heavy = pytest.mark.heavy  # each case: the installed command, a forkserver and its ranks


@dataclass
class Run:
    """What one broken job left behind."""

    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    folder: Path
    pids: list[int]        # every process the job started (forkserver, ranks), seen mid-run
    hung: bool = False     # it (or what it started) was still there after WAIT_S: ended here

    @property
    def stats(self) -> dict | None:
        path = self.folder / "stats.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def error_lines(self) -> list[str]:
        return [line.removeprefix("error: ") for line in self.stderr.splitlines()
                if line.startswith("error: ")]


# -- starting and breaking a job --------------------------------------------------------------

def write_config(folder: Path, *, cfg: bool = False, parallel: dict | None = None,
                 **args) -> Path:
    rollout = {"frames": FRAMES, "prompts": "prompts.txt"}
    if cfg:
        rollout = {"frames": FRAMES, "guidance_scale": 3.0, "negative_prompt": "blurry"}
    config = {"pipeline": {"entry": ENTRY, "args": {**TINY, "cfg": cfg, **args}},
              "runtime": {"memory_budget": "32MiB",
                          "parallel": {"threads": 1, **(parallel or {})}},
              "rollout": rollout, "output": {"path": str(folder / "v.npy")}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    path = folder / "run.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def start(folder: Path, *args: str, env: dict | None = None,
          command: list[str] | None = None) -> subprocess.Popen:
    """`ardiff rollout ARGS --json stats.json` in `folder`."""
    command = command or [str(BIN / "ardiff")]
    return subprocess.Popen([*command, "rollout", *args, "--json", "stats.json"], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen, folder: Path, started: float,
           pids: list[int] | None = None) -> Run:
    try:
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:  # a hang: end it (and what it started), then fail
        pids = pids or descendants(proc.pid)
        for pid in [proc.pid, *pids]:
            _kill(pid)
        stdout, stderr = proc.communicate()
        return Run(None, stdout, stderr, WAIT_S, folder, pids, hung=True)
    return Run(proc.returncode, stdout, stderr, time.monotonic() - started, folder, pids or [])


def marker(folder: Path, rank: int, blocks: int = 1) -> int:
    """The pid of `rank` once it has made `blocks` rollout blocks (0: entered load_hang)."""
    path = folder / f"blocks-{rank}"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            made, pid = path.read_text().split()
        except (FileNotFoundError, ValueError):
            made, pid = "-1", "0"
        if int(made) >= blocks:
            return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} made no block in {WAIT_S} s")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended too
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def listening_socket() -> socket.socket:
    """A port that is in use: listening, accepting, never answering."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_env(port: int) -> dict[str, str]:
    """What torchrun sets for rank 0 of 2, without torchrun (and so without rank 1)."""
    return {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}


# -- the cases ------------------------------------------------------------------------------

def signal_a_rank(folder: Path, signum: int, **config) -> Run:
    """Start a two-rank job; once rank 1 has made two blocks, send it `signum`."""
    path = write_config(folder, block_sleep_s=BLOCK_SLEEP_S, marker=str(folder / "blocks-{rank}"),
                        **config)
    started = time.monotonic()
    proc = start(folder, str(path), "-q")
    pid = marker(folder, 1, blocks=2)
    pids = descendants(proc.pid)
    os.kill(pid, signum)
    return finish(proc, folder, started, pids)


def kill_the_parent(folder: Path, wait_for: tuple[int, int], **config) -> Run:
    """Start a two-rank job; once rank `wait_for[0]` has made `wait_for[1]` blocks, SIGKILL
    the `ardiff rollout` process; wait for what it started to end."""
    path = write_config(folder, block_sleep_s=BLOCK_SLEEP_S, marker=str(folder / "blocks-{rank}"),
                        parallel={"workers": 2}, **config)
    started = time.monotonic()
    proc = start(folder, str(path), "-q")
    marker(folder, *wait_for)
    pids = descendants(proc.pid)
    proc.kill()
    run = finish(proc, folder, started, pids)  # stderr closes when the last rank has ended
    deadline = time.monotonic() + GONE_S
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    run.hung = run.hung or any(is_alive(pid) for pid in pids)
    run.exit_code = None  # killed: it has no exit code of its own
    return run


def run_case(case: RankFault, folder: Path) -> Run:
    folder.mkdir(parents=True)
    if case.name == "dp-sigterm":
        return signal_a_rank(folder, signal.SIGTERM, parallel={"workers": 2})
    if case.name == "cfg-sigterm":
        return signal_a_rank(folder, signal.SIGTERM, cfg=True, parallel={"cfg": 2})
    if case.name == "dp-sigkill":
        return signal_a_rank(folder, signal.SIGKILL, parallel={"workers": 2})
    if case.name == "missing-weights":  # the embedded default (the bouncing world model)
        started = time.monotonic()
        proc = start(folder, "--workers", "2", "--frames", "6", "-o", "v.npy",
                     "--set", f"pipeline.args.weights={folder / 'missing.safetensors'}",
                     "--set", "rollout.prompts=[a, b]")  # not quiet: the summary too
        return finish(proc, folder, started)
    if case.name == "env-peer-missing":
        path = write_config(folder, parallel={"launcher": "env", "timeout_s": 3})
        started = time.monotonic()
        return finish(start(folder, str(path), "-q", env=torchrun_env(free_port())), folder,
                      started)
    if case.name == "env-port-in-use":
        path = write_config(folder, parallel={"launcher": "env", "timeout_s": 3})
        with listening_socket() as taken:
            started = time.monotonic()
            proc = start(folder, str(path), "-q", env=torchrun_env(taken.getsockname()[1]))
            return finish(proc, folder, started)
    if case.name == "spawn-port-in-use":  # the race between picking the port and binding it
        path = write_config(folder, parallel={"workers": 2})
        with listening_socket() as taken:
            patch = ("import ardiff.launch.parent as parent, ardiff_cli.main as cli, sys; "
                     f"parent.free_port = lambda: {taken.getsockname()[1]}; "
                     "sys.argv[0] = 'ardiff'; cli.main()")
            started = time.monotonic()
            proc = start(folder, str(path), "-q", command=[sys.executable, "-c", patch])
            return finish(proc, folder, started, descendants(proc.pid))
    if case.name == "parent-killed-loading":
        return kill_the_parent(folder, (1, 0), fault="load_hang", on_rank=1)
    if case.name == "parent-killed":
        return kill_the_parent(folder, (1, 2))
    if case.name == "hung-rank-twice":  # a second signal abandons the block rank 1 hangs in
        path = write_config(folder, fault="hang", on_rank=1, marker=str(folder / "blocks-{rank}"),
                            parallel={"workers": 2})
        started = time.monotonic()
        proc = start(folder, str(path), "-q")
        marker(folder, 1, blocks=3)  # it makes block 3 next: that one never returns
        pids = descendants(proc.pid)
        for _ in range(2):
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
        return finish(proc, folder, started, pids)
    if case.name == "load-hang":  # failed after timeout_s, not after the 300 s it once was
        path = write_config(folder, fault="load_hang", on_rank=1,
                            marker=str(folder / "blocks-{rank}"),
                            parallel={"workers": 2, "timeout_s": 3})
        started = time.monotonic()
        proc = start(folder, str(path), "-q")
        marker(folder, 1, blocks=0)
        return finish(proc, folder, started, descendants(proc.pid))
    raise AssertionError(f"no way to run {case.name}")


class Runs(dict):
    """Each case run once, when a test first asks for it (`-k` runs only what it selects)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Run:
        case = next(case for case in RANK_FAULTS if case.name == name)
        if (self.root / name).exists():  # it was run, and broke: every test of it fails
            raise AssertionError(f"the run of {name} broke (see its first test)")
        self[name] = run = run_case(case, self.root / name)
        return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    return Runs(tmp_path_factory.mktemp("rank-faults"))


def frames_of(path: Path) -> int:
    return np.load(path).shape[0]


# -- every case -------------------------------------------------------------------------------

@heavy
@pytest.mark.parametrize("case", RANK_FAULTS, ids=lambda case: case.name)
def test_the_exit_code_the_status_and_one_error_line_say_which_rank_and_why(case, runs):
    run = runs[case.name]
    assert not run.hung, f"still running after {WAIT_S} s"
    assert "Traceback" not in run.stderr + run.stdout, run.stderr
    assert run.exit_code == case.exit_code, run.stderr
    if case.status is None:  # a killed parent: nothing reports, nothing complains
        assert run.error_lines == [] and run.stats is None, run.stderr
        return
    assert len(run.error_lines) == 1, run.stderr
    assert re.search(case.error, run.error_lines[0]), run.error_lines[0]
    stats = run.stats
    jsonschema.validate(stats, STATS_SCHEMA)
    assert (stats["status"], stats["exit_code"]) == (case.status, case.exit_code)
    assert run.error_lines[0] == " ".join(stats["error"].split())


@heavy
@pytest.mark.parametrize("case", RANK_FAULTS, ids=lambda case: case.name)
def test_no_process_of_the_job_is_left(case, runs):
    run = runs[case.name]
    pids = run.pids + [r["pid"] for r in (run.stats or {}).get("ranks", [])]
    assert [pid for pid in pids if is_alive(pid)] == []
    for rank in (run.stats or {}).get("ranks", []):
        if rank["kv"]:
            assert rank["kv"]["pages_in_use"] == 0, rank


# -- what each case leaves ----------------------------------------------------------------------

@heavy
def test_a_rank_stopped_by_sigterm_stops_the_job_and_keeps_every_finished_frame(runs):
    run = runs["dp-sigterm"]
    ranks = run.stats["ranks"]
    assert [r["status"] for r in ranks] == ["interrupted", "interrupted"]
    assert ranks[1]["error"] == "interrupted by SIGTERM"
    assert [Path(o["path"]).name for o in run.stats["outputs"]] == ["v-0.npy", "v-1.npy"]
    for output in run.stats["outputs"]:
        assert 0 < frames_of(Path(output["path"])) == output["frames"] < FRAMES
    assert run.stats["frames"]["written"] < run.stats["frames"]["requested"]
    assert not list(run.folder.glob(".*partial*"))


@heavy
def test_a_cfg_rank_stopped_by_sigterm_is_the_cause_not_its_peer(runs):
    run = runs["cfg-sigterm"]
    assert run.stats["ranks"][1]["error"] == "interrupted by SIGTERM"
    assert 0 < frames_of(run.folder / "v.npy") < FRAMES
    assert "peer" not in run.stats["error"]


@heavy
def test_a_killed_rank_fails_the_job_and_the_others_keep_their_frames(runs):
    run = runs["dp-sigkill"]
    rank0, rank1 = run.stats["ranks"]
    assert rank1["status"] == "failed" and rank1["exit_code"] == 1
    assert rank0["status"] == "interrupted"
    assert [Path(o["path"]).name for o in run.stats["outputs"]] == ["v-0.npy"]
    assert 0 < frames_of(run.folder / "v-0.npy") < FRAMES


@heavy
def test_ranks_that_fail_before_their_cache_exists_end_in_a_complete_summary(runs):
    run = runs["missing-weights"]
    assert "Rollout: failed" in run.stdout  # the summary table, whatever the ranks lacked
    assert run.stats["kv"]["kv_bytes_allocated"] == 0
    # Each rank fails alike, unless the stop of the first reaches the other while it loads.
    assert {r["status"] for r in run.stats["ranks"]} in ({"failed"}, {"failed", "interrupted"})
    assert run.stats["outputs"] == [] and not list(run.folder.glob("*.npy"))


@heavy
@pytest.mark.parametrize("name", ["env-peer-missing", "env-port-in-use", "spawn-port-in-use",
                                  "load-hang"])
def test_a_rendezvous_or_a_load_that_cannot_end_ends_within_timeout_s(runs, name):
    run = runs[name]
    # within seconds: not START_S (300 s), nor timeout_s's default (600 s)
    assert not run.hung and run.wall_s < 60, run.stderr
    assert run.stats["frames"]["written"] == 0


@heavy
def test_a_killed_parent_ends_its_ranks_with_their_files_finalised(runs):
    for name in ("parent-killed", "parent-killed-loading"):
        run = runs[name]
        assert len(run.pids) >= 3, name  # the forkserver and two ranks were seen
        assert not list(run.folder.glob(".*partial*")), name
    run = runs["parent-killed"]
    for stream in (0, 1):
        assert 0 < frames_of(run.folder / f"v-{stream}.npy") < FRAMES


@heavy
def test_a_second_signal_abandons_the_block_a_rank_hangs_in(runs):
    run = runs["hung-rank-twice"]
    # within seconds, not timeout_s (600 s): rank 1 abandoned block 3, both kept their frames
    assert not run.hung and run.wall_s < 60, run.stderr
    assert run.stats["ranks"][1]["status"] == "interrupted"  # rank 0 may have finished first
    assert frames_of(run.folder / "v-1.npy") == 3 * TINY["frames_per_block"]
    assert frames_of(run.folder / "v-0.npy") > 0
    assert "every rank abandons its block in flight" in run.stderr


# -- the docs -----------------------------------------------------------------------------------

def test_the_errors_page_lists_every_rank_fault():
    rows = [f"| {case.row} | {'-' if case.exit_code is None else case.exit_code} | "
            f"{'-' if case.status is None else f'`{case.status}`'} | {case.holds} |"
            for case in RANK_FAULTS]
    lines = ERRORS_PAGE.read_text(encoding="utf-8").splitlines()
    table = "\n".join([RANK_TABLE_HEADER, TABLE_RULE, *rows])
    assert RANK_TABLE_HEADER in lines, f"docs/errors.md has no rank fault table; it is:\n{table}"
    start = lines.index(RANK_TABLE_HEADER)
    found = [line for line in lines[start:start + len(rows) + 3] if line.startswith("|")]
    assert found == [RANK_TABLE_HEADER, TABLE_RULE, *rows], f"docs/errors.md differs:\n{table}"


# -- torchrun ------------------------------------------------------------------------------------

@heavy
@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="no torchrun")
def test_under_torchrun_a_failed_rank_is_said_once_and_quoted_in_torchruns_summary(tmp_path):
    """Rank 1 fails; rank 0 says the job's error, the only `error:` line (rank 1 said it too);
    torchrun's summary lists one failure, rank 0's, quoting that line rather than pointing at
    a traceback. torchrun still prints its own traceback: a rank exited non-zero."""
    path = write_config(tmp_path, fault="raise", on_rank=1, parallel={"launcher": "env"})
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", str(BIN / "ardiff"),
         "rollout", str(path), "-q", "--json", "stats.json"], cwd=tmp_path,
        capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    error = "rank 1: session 'stream-1' block 3: generate_block raised RankFault: injected at " \
            "block 3 on rank 1"
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [f"error: {error}"], result.stderr
    assert result.returncode == 1
    stats = json.loads((tmp_path / "stats.json").read_text())
    jsonschema.validate(stats, STATS_SCHEMA)
    assert (stats["status"], stats["error"]) == ("failed", error)
    assert "<NO_OTHER_FAILURES>" in result.stderr  # rank 1 told rank 0 and ended with 0
    assert f"traceback : {error}" in result.stderr


@heavy
@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="no torchrun")
def test_under_torchrun_a_rank_stuck_loading_ends_the_job_within_timeout_s(tmp_path):
    """Rank 1 never finishes loading: rank 0 stops waiting for it after timeout_s and says so
    (it once read 'a peer left'); torchrun's SIGTERM then ends rank 1 at once, quietly (it
    was taken for a rank in its rollout, and killed 30 s later)."""
    path = write_config(tmp_path, fault="load_hang", on_rank=1,
                        parallel={"launcher": "env", "timeout_s": 3})
    started = time.monotonic()
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", str(BIN / "ardiff"),
         "rollout", str(path), "-q", "--json", "stats.json"], cwd=tmp_path,
        capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall_s = time.monotonic() - started
    error = ("rank 0: the other ranks did not all finish loading within "
             "runtime.parallel.timeout_s (3 s); a pipeline that loads longer needs a larger one "
             "(no result from rank 1)")
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [f"error: {error}"], result.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    jsonschema.validate(stats, STATS_SCHEMA)
    assert stats["error"] == error
    assert "forcefully exiting" not in result.stderr  # torchrun did not have to SIGKILL it
    assert wall_s < 30 + 10, wall_s  # startup and timeout_s, not torchrun's 30 s grace

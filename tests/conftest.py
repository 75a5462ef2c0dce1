"""Shared fixtures. Test helpers live in tests/support/, which pytest puts on the import path
(`pythonpath` in pyproject.toml), so `spec_pipelines:Name` entries import."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from extras import extra_skip_reason, hide_extras, missing_extra_packages
from typer.testing import CliRunner, Result

PIPELINES_FILE = Path(__file__).parent / "support" / "spec_pipelines.py"
MAX_TEST_WORKERS = 8  # each worker imports torch (~0.5 GiB): more cores than this gain little


@pytest.hookimpl(optionalhook=True)  # without xdist (`-p no:xdist`) nobody calls it
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core this process may run on (the affinity mask, which a
    container's cpuset narrows; os.cpu_count() would count the host's), at most 8."""
    usable = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    cores = len(usable(0)) if usable else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_TEST_WORKERS))


def pytest_addoption(parser) -> None:
    parser.addoption("--without-extras", action="store_true",
                     help="run as a [test]-only install would: the extras' packages are hidden "
                          "(tests/test_extras.py)")


def pytest_configure(config) -> None:
    if config.getoption("--without-extras"):
        hide_extras()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is seen
def pytest_collection_modifyitems(items) -> None:
    """A `heavy` test is `slow` too, so `-m "not slow"` (which replaces addopts'
    `-m "not heavy"`) still leaves it out. A test marked `extra("NAME")` skips, naming the
    extra, when one of that extra's packages is not installed."""
    for item in items:
        if item.get_closest_marker("heavy") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        for mark in item.iter_markers("extra"):
            missing = missing_extra_packages(*mark.args)
            if missing:
                item.add_marker(pytest.mark.skip(reason=extra_skip_reason(mark.args[0], missing)))


@pytest.fixture
def pipelines_file() -> Path:
    """Absolute path of the fixture pipelines, for `file.py:attr` entries."""
    return PIPELINES_FILE


@pytest.fixture
def write_config(tmp_path):
    """`write_config(text, name="run.yaml") -> Path`: dedented YAML written under tmp_path."""

    def write(text: str, name: str = "run.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def ardiff_main():
    """`ardiff_main(*args) -> Result`: the `ardiff` script's `main()` in this process, under
    Typer's runner. Unlike `CliRunner().invoke(app, ...)` it goes through the script's own
    handler, so a usage error is one `error:` line with exit 2, as in a terminal. An
    exception that escapes `main()` fails the test (a user would see a traceback)."""
    from ardiff_cli.main import main  # here: a broken CLI fails its tests, not every test

    def run(*args: object) -> Result:
        runner = CliRunner()
        with runner.isolation() as streams, pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", ["ardiff", *map(str, args)])
            # Click names the program after __main__: "python -m pytest" under `python -m`.
            patch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
            try:
                main()
            except SystemExit as exc:
                code = exc.code
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, stderr, output = (stream.getvalue() for stream in streams)
        return Result(runner=runner, stdout_bytes=stdout, stderr_bytes=stderr,
                      output_bytes=output, return_value=None, exit_code=code, exception=None)

    return run


@pytest.fixture(autouse=True)
def _stop_signals_restored():
    """The `ardiff` script's main() leaves SIG_IGN for the stop signals behind (its process ends
    there); a test that runs it in this process must not leave later tests (and the
    processes they start) ignoring Ctrl-C."""
    from ardiff_cli import _signals as signals

    handlers = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    yield
    signals.end_with_the_process(False)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tests use tiny tensors: one intra-op thread is faster than two, and immune to the
    spin-waits of a busy 2-core machine (measured: an attention call 16 us vs 6-10 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

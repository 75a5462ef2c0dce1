"""Option definitions shared by every command, so each flag means one thing everywhere."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import select
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import typer

from ardiff_cli._help import FROM_CONFIG

ConfigArg = typer.Argument(..., help="Run config (YAML).", show_default=False)
OptionalConfigArg = typer.Argument(None, help="Run config (YAML); omit for the embedded default.",
                                   show_default=False)
SetOpt = typer.Option(None, "--set", metavar="KEY=VALUE",
                      help="Override any config key, e.g. --set runtime.kv.window_frames=12 "
                           "(repeatable).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of tables.")
DebugOpt = typer.Option(False, "--debug", help="Show the traceback of an error.")
BudgetOpt = typer.Option(None, "--budget", show_default=FROM_CONFIG, metavar="SIZE",
                         help="KV memory budget: bytes (6GiB, 512MiB) or a fraction of free "
                              "memory (0.8).")
DtypeOpt = typer.Option(None, "--dtype", show_default=FROM_CONFIG, help="KV and model dtype: auto (bfloat16 on CUDA, "
                        "float32 on CPU), float32, bfloat16, float16.")
PageTokensOpt = typer.Option(None, "--page-tokens", show_default=FROM_CONFIG, help="Tokens per KV page (one frame unless the config says).")
DeviceOpt = typer.Option(None, "--device", show_default=FROM_CONFIG, help="cpu, cuda, cuda:N or auto.")
WorkersOpt = typer.Option(None, "--workers", show_default=FROM_CONFIG, metavar="N",
                          help="Data-parallel replicas (processes): prompt i runs on i % N.")
CfgParallelOpt = typer.Option(None, "--cfg-parallel", show_default=FROM_CONFIG, metavar="2",
                              help="2: run the two CFG branches on two ranks (1: off).")
BatchOpt = typer.Option(None, "--batch", show_default=FROM_CONFIG, metavar="N|auto",
                        help="Prompts advanced together, one forward per block for all (each "
                        "its own file); auto: ardiff chooses.")


def batch_value(text: Optional[str]) -> object:
    """`--batch`: an integer where the text reads as one (the config checks its range), else
    the text (`auto`, or a mistake the config names)."""
    try:
        return None if text is None else int(text)
    except ValueError:
        return text

FIFO_WAIT_S = 5.0   # how long `--json FIFO` waits for a reader (to open it, then per write)
FIFO_POLL_S = 0.05

OptionalPath = Optional[Path]
OverrideList = Optional[List[str]]


def flag_overrides(**flags: object) -> list[str]:
    """Turn CLI flags given as `dotted_key=value` pairs into `--set` overrides (None: unset).

    Values are JSON-encoded (JSON is YAML), so a prompt like `a: b` stays a string; a float
    that is not finite is written as YAML's `.nan` / `.inf`, so the config's range check (not
    a type error about a string 'NaN') names it. JSON writes U+1F600 as the escaped pair
    `\\ud83d\\ude00`, which the YAML loader joins (`ardiff.config.yaml_loader`), so a flag
    carries any Unicode; bytes that are not UTF-8 stay lone surrogates, which the config
    refuses.
    """
    return [f"{key}={_yaml_value(value)}" for key, value in flags.items() if value is not None]


def _yaml_value(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    return json.dumps(value)


def load_run_config(config: Optional[Path], overrides: Optional[List[str]],
                    flags: dict[str, object]):
    """The run config: the file (None: the embedded default; `~` expanded), then `--set`,
    then the flags."""
    from ardiff.config.run import load_config

    config = None if config is None else config.expanduser()
    return load_config(config, [*(overrides or []), *flag_overrides(**flags)])


def check_json_path(json_path: Optional[str], config: Optional[Path] = None) -> None:
    """A `--json PATH` must be writable before any work starts, or the numbers would be lost
    after it, and must not be the config the command reads ('-' is stdout, None no JSON).
    Raises ConfigError / OutputPathError (exit 2) naming `--json`. The rules live with the
    rollout's other paths (ardiff.rollout.paths), so every command applies the same ones."""
    if json_path in (None, "-"):
        return
    from ardiff.rollout.paths import check_run_paths, check_written_file

    check_written_file("--json", json_path)
    if config is not None:
        check_run_paths([("--json", json_path)], [("config", config)])


def check_command_paths(run_config, config: Optional[Path], json_path: Optional[str] = None,
                        written: Sequence[tuple[str, object]] = (), videos: bool = True,
                        pipeline: object = None) -> None:
    """Before any work: every path the command writes (its videos unless `videos` is False,
    `--json`, and `written`: (flag, path or None)) against every path it reads (the config,
    the prompts and actions files, the entry's file, what the pipeline declares it loads)
    and each other (ardiff.rollout.paths). Builds the pipeline when not given and there is
    more than videos to check (cheap: no weights; a run checks its videos itself). Raises
    ConfigError / OutputPathError / PipelineLoadError (exit 2)."""
    from ardiff.rollout.paths import check_rollout_paths

    files = [(flag, path) for flag, path in written if path is not None]
    if json_path == "-":
        _check_not_stdout(run_config, files, videos)
    if pipeline is None and (files or json_path not in (None, "-")):
        from ardiff.engine.loader import build_pipeline

        pipeline = build_pipeline(run_config.pipeline, run_config.base_dir)
    check_rollout_paths(run_config, None if videos else (), config_file=config,
                        stats_file=json_path, written=files, pipeline=pipeline)


STDOUT_NAMES = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


def _check_not_stdout(run_config, files: Sequence[tuple[str, object]], videos: bool) -> None:
    """With `--json -` stdout is the stats' alone (what else is printed goes to stderr, fd 1
    included): an output whose links lead to stdout is refused (OutputPathError, exit 2)."""
    from ardiff.errors import OutputPathError
    from ardiff.rollout.streams import output_paths

    named = [("output.path", path) for path in (output_paths(run_config) if videos else [])]
    for field, path in [*named, *files]:
        shown = str(path)
        if _leads_to_stdout(shown):
            raise OutputPathError(f"{field}: {shown!r} leads to stdout, which --json - gives "
                                  f"to the stats alone; write it to a file, or the stats with "
                                  f"--json PATH")


def _leads_to_stdout(text: str) -> bool:
    """Whether `text` or a symlink it passes through names descriptor 1 (/dev/stdout...)."""
    own = f"/proc/{os.getpid()}/fd/1"
    path = os.path.abspath(os.path.expanduser(text))
    for _ in range(40):  # as many links as the kernel follows
        if path in STDOUT_NAMES or path == own:
            return True
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def write_json_file(json_path: str, data: dict, kept: str = "") -> Optional[str]:
    """Write `data` to the `--json` file; returns why it could not be (disk full...), else
    None. `kept` says what survives, e.g. "the video is kept; "."""
    path = Path(json_path).expanduser()
    try:
        write_whole(path, json.dumps(data, indent=2) + "\n")
    except TimeoutError as exc:  # a FIFO nobody reads
        return (f"--json: {str(path)!r} is a FIFO and {exc}; the stats were not written; "
                f"{kept}start its reader first")
    except OSError as exc:
        return (f"--json: cannot write {str(path)!r} ({type(exc).__name__}: {exc}); {kept}"
                f"check free disk space and permissions")
    return None


def write_whole(path: Path, text: str) -> None:
    """Write `text` so a reader sees the old file or the new one, never a mix: a regular file
    (or a new one) is written beside its target (a symlink's target) and moved over it in one
    os.replace; anything else (a device such as /dev/full, a FIFO) is written directly, a FIFO
    only if a reader comes (`_write_fifo`)."""
    from ardiff.path_text import landing

    target, stream = landing(path)  # a symlink's target; /dev/stdout's pipe or terminal
    if stream and target.is_fifo():
        _write_fifo(target, text)
        return
    if stream:  # a device
        target.write_text(text)
        return
    fd, work = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.chmod(work, _mode_for(target))
        os.replace(work, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(work)
        raise


def _write_fifo(target: Path, text: str) -> None:
    """Write `text` into a FIFO without waiting for good (a stop must not hang on it): a reader
    must open it within FIFO_WAIT_S, and take each part within FIFO_WAIT_S; else TimeoutError."""
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader has it open
                raise
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no reader opened it within {FIFO_WAIT_S:g} s") from None
            time.sleep(FIFO_POLL_S)
    try:
        data = memoryview(text.encode())
        while data:
            if not select.select([], [fd], [], FIFO_WAIT_S)[1]:
                raise TimeoutError(f"its reader took nothing for {FIFO_WAIT_S:g} s")
            with contextlib.suppress(BlockingIOError):  # less room than this write needs
                data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def _mode_for(target: Path) -> int:
    """The existing file's permissions, or what a plain open() would give a new file."""
    if target.exists():
        return stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_output_file(flag: str, target: Path, what: str,
                      write: Callable[[Path], None]) -> Optional[str]:
    """Write an output through a work file beside `target` (`ardiff.video.disk.written_through`:
    moved when whole, or copied into a FIFO or device); returns why it could not be written
    (None: it was). `what` names it in the message ("the picture", "the action log")."""
    from ardiff.errors import ArdiffError
    from ardiff.video.disk import written_through

    path: Optional[Path] = None
    try:
        with written_through(target) as path:
            write(path)
    except TimeoutError as exc:
        return (f"{flag}: {str(target)!r} is a FIFO and {exc}; {what} was not written; start "
                f"its reader first")
    except OSError as exc:  # writing into a FIFO or device
        return (f"{flag}: cannot write {str(target)!r} ({type(exc).__name__}: "
                f"{exc.strerror or exc}); choose a writable path")
    except ArdiffError as exc:  # it names the file written: the work file, not the user's
        return str(exc) if path is None else str(exc).replace(str(path), str(target))
    return None

"""The run config: one typed, frozen object per section, validated when built.

A YAML file has five sections — `pipeline`, `runtime`, `warmup`, `rollout`,
`output` — and every key has its default here and nowhere else. CLI flags and
`--set a.b.c=value` overrides edit the same plain data before it is built, so
they get the same validation and the same error messages.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from ardiff.config import schema
from ardiff.dtypes import DTYPE_BYTES, DTypeName
from ardiff.errors import ConfigError
from ardiff.sizes import MemoryBudget

DEFAULT_CONFIG_NAME = "default.yaml"
_DEVICE_RE = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


def _check_min(where: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        rule = "> 0" if minimum == 1 else f">= {minimum}"
        raise ConfigError(f"{where}: {value!r} is invalid; it must be {rule}")


@dataclass(frozen=True)
class PipelineConfig:
    """Which pipeline to build: `entry` is `pkg.module:attr`, `file.py:attr` or a registered name."""

    entry: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KVConfig:
    """Runtime overrides of the spec's window, and how the cache is stored."""

    backend: Literal["paged", "dense"] = "paged"
    window_frames: int | None = None
    sink_frames: int | None = None
    page_tokens: int | None = None
    # Fill unused and freed pages with NaN so a wrong read shows (debugging aid; slower).
    poison: bool = False

    def __post_init__(self) -> None:
        _check_min("runtime.kv.window_frames", self.window_frames, 1)
        _check_min("runtime.kv.sink_frames", self.sink_frames, 0)
        _check_min("runtime.kv.page_tokens", self.page_tokens, 1)


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the pipeline runs, and how much memory its KV cache may take."""

    device: str = "cpu"
    dtype: DTypeName = "float32"
    memory_budget: MemoryBudget = MemoryBudget(fraction=0.8)
    max_sessions: int | None = None
    kv: KVConfig = KVConfig()

    def __post_init__(self) -> None:
        if not _DEVICE_RE.match(self.device):
            raise ConfigError(f"runtime.device: {self.device!r} is not a device; "
                              f"use cpu, cuda, cuda:N or auto")
        _check_min("runtime.max_sessions", self.max_sessions, 1)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class WarmupConfig:
    """Whether to run the pipeline's warmup requests before the rollout."""

    enabled: bool = True


@dataclass(frozen=True)
class PromptSwitch:
    """From video frame `frame` on (rounded up to a block boundary), generate `prompt`.

    `on_switch` says what happens to the session at the switch: `keep` its KV
    history (the pipeline re-encodes the prompt), `clear-cross` drop its
    cross-attention K/V first, or `reset` start the session over at frame 0.
    """

    frame: int
    prompt: str
    on_switch: Literal["keep", "clear-cross", "reset"] = "keep"

    def __post_init__(self) -> None:
        _check_min("rollout.prompt[].frame", self.frame, 0)


@dataclass(frozen=True)
class RolloutConfig:
    """What to generate. Paths to files are relative to the config file."""

    frames: int = 48                     # video frames written per prompt
    seed: int = 0
    prompt: str | list[PromptSwitch] = ""  # a prompt, or a schedule of switches
    negative_prompt: str = ""
    prompts: list[str] | str | None = None  # several prompts (one video each): a list or a file
    interleave: bool = False             # run several prompts round-robin, all resident
    actions: list[str | list[str]] | str | None = None  # per block (repeating), or a file
    num_steps: int | None = None         # None: the pipeline's default
    guidance_scale: float = 1.0

    def __post_init__(self) -> None:
        _check_min("rollout.frames", self.frames, 1)
        _check_min("rollout.num_steps", self.num_steps, 1)
        if isinstance(self.prompt, list):
            self._check_schedule(self.prompt)
            if self.prompts is not None:
                raise ConfigError("rollout.prompts: cannot be combined with a rollout.prompt "
                                  "schedule; use one or the other")

    @staticmethod
    def _check_schedule(schedule: list[PromptSwitch]) -> None:
        frames = [switch.frame for switch in schedule]
        if not frames or frames[0] != 0:
            raise ConfigError(f"rollout.prompt: a schedule must start at frame 0, got frames "
                              f"{frames}; add {{frame: 0, prompt: ...}} first")
        if any(b <= a for a, b in zip(frames, frames[1:])):
            raise ConfigError(f"rollout.prompt: schedule frames {frames} must increase strictly")


@dataclass(frozen=True)
class OutputConfig:
    """Where the video goes. The extension picks the format (see ardiff.video.writer)."""

    path: str = "ardiff_out.mp4"  # several prompts: {index} in the name, or -<index> is added
    fps: float = 16.0
    codec: str | None = None      # None: the format's default (libx264, ffv1, libvpx-vp9)
    crf: int | None = None        # None: the codec's default quality
    preset: str | None = None     # x264 preset; None: veryfast

    def __post_init__(self) -> None:
        if self.fps <= 0:
            raise ConfigError(f"output.fps: {self.fps!r} must be > 0; try 16")
        _check_min("output.crf", self.crf, 0)


@dataclass(frozen=True)
class RunConfig:
    """A whole run config. `base_dir` is where relative paths in it are resolved."""

    pipeline: PipelineConfig
    runtime: RuntimeConfig = RuntimeConfig()
    warmup: WarmupConfig = WarmupConfig()
    rollout: RolloutConfig = RolloutConfig()
    output: OutputConfig = OutputConfig()
    base_dir: Path = field(default=Path("."), compare=False, init=False)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML run config (None: the embedded default) and apply `--set` overrides."""
    if path is None:
        text = resources.files("ardiff.configs").joinpath(DEFAULT_CONFIG_NAME).read_text()
        data, base_dir = parse_yaml(text, "<embedded default.yaml>"), Path.cwd()
    else:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config: {str(path)!r} does not exist or is not a file; "
                              f"check the path (or omit it to use the embedded default)")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config: cannot read {str(path)!r} ({type(exc).__name__}: {exc}); "
                              f"give a UTF-8 YAML file") from exc
        data, base_dir = parse_yaml(text, str(path)), path.resolve().parent
    return build_config(data, overrides, base_dir)


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse YAML text into a mapping; syntax errors name line and column."""
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        raise ConfigError(f"{source}: YAML syntax error at {where}: {exc.problem}; "
                          f"fix the YAML there") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections "
                          f"(pipeline, runtime, ...), got {type(data).__name__}")
    return data


def build_config(data: dict[str, Any], overrides: list[str] = (),
                 base_dir: Path = Path(".")) -> RunConfig:
    """Apply `--set` overrides to plain data, then validate it into a `RunConfig`."""
    data = copy.deepcopy(data)
    for override in overrides:
        apply_override(data, override)
    config = schema.build(RunConfig, data, "")
    return _with_base_dir(config, base_dir)


def _with_base_dir(config: RunConfig, base_dir: Path) -> RunConfig:
    object.__setattr__(config, "base_dir", Path(base_dir))
    return config


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` (value parsed as YAML) to nested plain data, in place."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip() or any(part == "" for part in key.strip().split(".")):
        raise ConfigError(f"--set: {override!r} is not KEY=VALUE; write e.g. "
                          f"--set runtime.kv.window_frames=12")
    parts = key.strip().split(".")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {'.'.join(parts[:i + 1])} is a value, not a "
                              f"section; it cannot hold {parts[i + 1]!r}")
        node = child
    node[parts[-1]] = value

"""The run config: one typed, frozen pydantic dataclass per section, validated when built.

    config = load_config("run.yaml", ["runtime.kv.window_frames=12"])   # or build_config(data)

Sections: `pipeline`, `runtime`, `warmup`, `rollout`, `output`, `play`, `serve`. Every default lives
here and nowhere else; CLI flags and `--set` edit the same plain data before it is built,
so they get the same checks and the same one-line messages (`ardiff.config.schema`).
Types are strict (`"12"` is not an integer), unknown keys are errors, every number has a
ceiling (`ardiff.limits`; docs/configs.md gives the reasons), floats are finite, text is
valid Unicode without NUL, and YAML is read with limits (`ardiff.config.yaml_loader`).
A field's docstring is its description in the JSON Schema (`config_json_schema`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ardiff.config import schema
from ardiff.config.parallel import ParallelConfig
from ardiff.config.play import PlayConfig
from ardiff.config.serve import ServeConfig
from ardiff.config.yaml_loader import safe_load
from ardiff.dtypes import DTYPE_BYTES, RuntimeDTypeName
from ardiff.errors import ConfigError
from ardiff.kv.backends import BACKENDS, DEFAULT_BACKEND, backend_names
from ardiff.limits import (
    MAX_CRF,
    MAX_FPS,
    MAX_FRAMES,
    MAX_NUM_STEPS,
    MAX_PAGE_TOKENS,
    MAX_SCALE,
    MAX_SEED,
    MAX_SESSIONS,
    MIN_FPS,
)
from ardiff.sizes import MemoryBudget
from ardiff.text import find_bad_text, path_problem, short_repr, shorten, text_problem

DEFAULT_CONFIG_NAME = "default.yaml"
DEVICE_PATTERN = r"^(cpu|auto|cuda(:\d+)?)$"
# Unknown keys are errors; the docstring under a field is its description in the JSON Schema.
_SECTION = ConfigDict(extra="forbid", use_attribute_docstrings=True)

FrameCount = Annotated[StrictInt, Field(gt=0, le=MAX_FRAMES)]
FrameIndex = Annotated[StrictInt, Field(ge=0, le=MAX_FRAMES)]
Finite = Annotated[StrictFloat, Field(allow_inf_nan=False)]


def _is_text(text: str) -> str:
    problem = text_problem(text)
    if problem:
        raise ValueError(f"{short_repr(text)} {problem}")
    return text


def _is_a_path(text: str) -> str:
    problem = path_problem(text)
    if problem:
        raise ValueError(f"{short_repr(text)} {problem}")
    return text


# Text a config holds: valid Unicode (no lone surrogate) without NUL; a path also fits
# the file systems' limits on lengths (ardiff.text).
Text = Annotated[StrictStr, AfterValidator(_is_text)]
PathText = Annotated[Text, AfterValidator(_is_a_path)]

def _is_backend(name: Any) -> str:
    """A name of `ardiff.kv.backends.BACKENDS`, read when validating (pydantic's Literal words)."""
    if isinstance(name, str) and name in BACKENDS:
        return name
    *head, last = (repr(known) for known in backend_names())
    expected = f"{', '.join(head)} or {last}" if head else last
    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


BackendName = Annotated[str, BeforeValidator(_is_backend), Field(
    json_schema_extra=lambda schema: schema.update(enum=list(backend_names())))]

def _is_batch_size(value: Any) -> int | None:
    """rollout.batch: an integer from 1 to MAX_SESSIONS, or auto / null (ardiff chooses)."""
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{short_repr(value)} is not a batch size; give an integer >= 1, or "
                         f"auto to let ardiff choose")
    if not 1 <= value <= MAX_SESSIONS:
        raise ValueError(f"{value} is invalid; it must be from 1 to {MAX_SESSIONS} (sessions "
                         f"in one forward), or auto")
    return value


BatchSize = Annotated[int | None, BeforeValidator(_is_batch_size), Field(
    json_schema_extra=lambda schema: schema.update(
        anyOf=[{"type": "integer", "minimum": 1, "maximum": MAX_SESSIONS},
               {"const": "auto"}, {"type": "null"}]))]

_S = TypeVar("_S")
# A section left empty in YAML (`runtime:`) means all its defaults.
Section = Annotated[_S, BeforeValidator(lambda value: {} if value is None else value)]


@dataclass(frozen=True, config=_SECTION)
class PipelineConfig:
    """Which pipeline to build: `entry` is `pkg.module:attr`, `file.py:attr` or a registered name."""

    entry: Text
    """`pkg.module:attr`, `path/file.py:attr` (relative to the config file) or a name."""
    args: dict[Any, Any] = field(default_factory=dict)
    """Keyword arguments of the pipeline's class or factory (constructing it checks them)."""

    @field_validator("args")
    @classmethod
    def _args_are_text(cls, args: dict[Any, Any]) -> dict[Any, Any]:
        bad = find_bad_text(args)
        if bad:
            where, text, problem = bad
            raise ValueError(f"{short_repr(text)} (at {where}) {problem}")
        return args


@dataclass(frozen=True, config=_SECTION)
class KVConfig:
    """Runtime overrides of the spec's window, and how the cache is stored."""

    backend: BackendName = DEFAULT_BACKEND
    """A name in ardiff.kv.backends.BACKENDS: paged (the runtime) or dense (the reference)."""
    window_frames: FrameCount | None = None
    sink_frames: FrameIndex | None = None
    page_tokens: Annotated[StrictInt, Field(gt=0, le=MAX_PAGE_TOKENS)] | None = None
    poison: StrictBool = False
    """Fill unused and freed pages with NaN so a wrong read shows (debugging aid; slower)."""


@dataclass(frozen=True, config=_SECTION)
class RuntimeConfig:
    """Where and how the pipeline runs, and how much memory its KV cache may take."""

    device: Text = Field(default="cpu", json_schema_extra={"pattern": DEVICE_PATTERN})
    """cpu, cuda, cuda:N or auto (CUDA when there is one)."""
    dtype: RuntimeDTypeName = "auto"
    """auto (bfloat16 on CUDA, float32 on CPU, resolved with the device), or a dtype."""
    memory_budget: MemoryBudget = Field(default=0.8, validate_default=True)  # 0.8 of free memory
    max_sessions: Annotated[StrictInt, Field(gt=0, le=MAX_SESSIONS)] | None = None
    """A cap below what the budget allows (None: as many as fit)."""
    kv: Section[KVConfig] = KVConfig()
    parallel: Section[ParallelConfig] = ParallelConfig()
    compile: StrictBool = False
    """torch.compile the pipeline's layer stack when the runner is built (the pipeline
    must offer `compile_layers`); the first blocks then take longer while it compiles."""

    @field_validator("device")
    @classmethod
    def _is_a_device(cls, device: str) -> str:
        if not re.match(DEVICE_PATTERN, device):
            raise ValueError(f"{device!r} is not a device; use cpu, cuda, cuda:N or auto")
        return device

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of an explicit dtype (`auto` has none until the device is
        known: `ardiff.engine.device.resolve_dtype`)."""
        if self.dtype == "auto":
            raise ValueError("runtime.dtype is auto: resolve it with the device first "
                             "(ardiff.engine.device.resolve_dtype)")
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, config=_SECTION)
class WarmupConfig:
    """Whether to run the pipeline's warmup requests before the rollout."""

    enabled: StrictBool = True


def _frame_not_required(schema: dict[str, Any]) -> None:
    """A schedule entry gives `frame` or `latent_frame` (its JSON Schema: neither required)."""
    schema["required"] = [key for key in schema.get("required", []) if key != "frame"]


@dataclass(frozen=True, config=ConfigDict(**_SECTION, json_schema_extra=_frame_not_required))
class PromptSwitch:
    """From video frame `frame` on (rounded up to a block boundary), generate `prompt`.

    `latent_frame` instead of `frame` counts the pipeline's latent frames, for a pipeline
    that declares how they map to video frames (`video_frames_per_latent_frame`; causal-Wan:
    latent frame L > 0 starts at video frame 1 + 4 (L - 1)); the rollout plan converts it
    (`ardiff.rollout.streams`).

    `on_switch` says what happens to the session at the switch: `keep` its KV
    history (the pipeline re-encodes the prompt), `clear-cross` drop its
    cross-attention K/V first, `reset` start the session over at frame 0, or
    `recache` drop the cross-attention K/V and ask the pipeline to re-run its last
    frames under the new prompt (`extra["recache"]`; causal-wan: LongLive's switch;
    a pipeline that does not know it just clears the cross-attention K/V).
    """

    frame: FrameIndex | None
    prompt: Text
    on_switch: Literal["keep", "clear-cross", "reset", "recache"] = "keep"
    latent_frame: FrameIndex | None = None

    @model_validator(mode="before")
    @classmethod
    def _frame_may_be_left_out(cls, data: Any) -> Any:
        if isinstance(data, dict) and "frame" not in data:
            return {"frame": None, **data}
        return data

    @model_validator(mode="after")
    def _frame_or_latent_frame(self) -> PromptSwitch:
        if self.frame is not None and self.latent_frame is not None:
            raise ValueError(f"frame {self.frame} and latent_frame {self.latent_frame} both "
                             f"given; give one of them")
        if self.frame is None and self.latent_frame is None:
            raise ValueError("a schedule entry needs frame (a video frame) or latent_frame; "
                             "add one")
        return self

    @property
    def unit(self) -> str:
        """The key the entry gives its position in: `frame` or `latent_frame`."""
        return "frame" if self.frame is not None else "latent_frame"

    @property
    def position(self) -> int:
        """The entry's frame, in its own unit (`unit`)."""
        return self.frame if self.frame is not None else int(self.latent_frame or 0)


@dataclass(frozen=True, config=_SECTION)
class RolloutConfig:
    """What to generate. Paths to files are relative to the config file."""

    frames: FrameCount = 48
    """Video frames written per prompt."""
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] = 0
    prompt: Text | list[PromptSwitch] = ""
    """A prompt, or a schedule of switches starting at frame 0."""
    negative_prompt: Text = ""
    prompts: list[Text] | PathText | None = None
    """Several prompts (one video each): a list, or a file with one per line."""
    interleave: StrictBool = False
    """Run several prompts round-robin, all resident."""
    batch: BatchSize = None
    """Prompts advanced together, one forward per block for all of them (a pipeline with
    generate_blocks); None or auto: ardiff chooses (docs/configs.md#batching-several-prompts)."""
    actions: list[Text | list[Text]] | PathText | None = None
    """One action (or several) per block, repeating; or a YAML file with the list."""
    num_steps: Annotated[StrictInt, Field(gt=0, le=MAX_NUM_STEPS)] | None = None
    """None: the pipeline's default."""
    guidance_scale: Finite = 1.0

    @field_validator("prompt")
    @classmethod
    def _schedule_starts_at_zero_and_increases(cls, prompt: str | list[PromptSwitch]):
        if isinstance(prompt, str):
            return prompt
        frames = [switch.position for switch in prompt]
        if not frames or frames[0] != 0:
            raise ValueError(f"a schedule must start at frame 0, got frames {frames}; "
                             f"add {{frame: 0, prompt: ...}} first")
        if any(b <= a for a, b in zip(frames, frames[1:])):  # mixed units: checked in the plan
            if len({switch.unit for switch in prompt}) == 1:
                raise ValueError(f"schedule {prompt[0].unit}s {frames} must increase strictly")
        return prompt

    @field_validator("prompts")
    @classmethod
    def _not_with_a_schedule(cls, prompts: list[str] | str | None, info: ValidationInfo):
        if prompts is not None and isinstance(info.data.get("prompt"), list):
            raise ValueError("cannot be combined with a rollout.prompt schedule; "
                             "use one or the other")
        return prompts


@dataclass(frozen=True, config=_SECTION)
class OutputConfig:
    """Where the video goes. The extension picks the format (see ardiff.video.writer)."""

    path: PathText = "ardiff_out.mp4"
    """Several prompts: {index} in the name, or -<index> is added."""
    fps: StrictFloat = Field(default=16.0, json_schema_extra={"minimum": MIN_FPS,
                                                              "maximum": MAX_FPS})
    codec: Text | None = None
    """None: the format's default (libx264, ffv1, libvpx-vp9)."""
    crf: Annotated[StrictInt, Field(ge=0, le=MAX_CRF)] | None = None
    """None: the codec's default quality."""
    preset: Text | None = None
    """x264 preset; None: ultrafast."""
    scale: Annotated[StrictInt, Field(ge=1, le=MAX_SCALE)] = 1
    """Nearest-neighbour upscale done by the video writer on its own thread; 1: none."""

    @field_validator("fps")
    @classmethod
    def _fps_is_a_rate_every_format_stores(cls, fps: float) -> float:
        # Checked here, not with Field(gt=0), so the message can suggest a value.
        if not math.isfinite(fps):
            raise ValueError(f"{fps!r} is invalid; it must be a finite number; try 16")
        if fps <= 0:
            raise ValueError(f"{fps!r} must be > 0; try 16")
        if not MIN_FPS <= fps <= MAX_FPS:
            raise ValueError(f"{fps!r} is invalid; it must be from {MIN_FPS:g} to {MAX_FPS:g} "
                             f"frames per second (what every output format stores); try 16")
        return fps


@dataclass(frozen=True, config=_SECTION)
class RunConfig:
    """A whole run config. `base_dir` is where relative paths in it are resolved."""

    pipeline: Section[PipelineConfig]
    runtime: Section[RuntimeConfig] = RuntimeConfig()
    warmup: Section[WarmupConfig] = WarmupConfig()
    rollout: Section[RolloutConfig] = RolloutConfig()
    output: Section[OutputConfig] = OutputConfig()
    play: Section[PlayConfig] = PlayConfig()
    """Keys of `ardiff play` (ardiff.config.play)."""
    serve: Section[ServeConfig] = ServeConfig()
    """`ardiff serve`: admission, idle sessions, recordings, limits (ardiff.config.serve)."""
    base_dir: SkipJsonSchema[Path] = field(default=Path("."), compare=False, init=False)


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of a run config file (draft-07 compatible), for editors and linters."""
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            **schema.json_schema(RunConfig), "title": "ardiff run config"}


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML run config (None: the embedded default) and apply `--set` overrides."""
    data, base_dir = read_config_data(path)
    return build_config(data, overrides, base_dir)


def read_config_data(path: str | Path | None) -> tuple[dict[str, Any], Path]:
    """A YAML run config's plain data (None: the embedded default's) and the folder its
    relative paths resolve against; not validated yet (`build_config` does)."""
    if path is None:
        text = resources.files("ardiff.configs").joinpath(DEFAULT_CONFIG_NAME).read_text()
        data, base_dir = parse_yaml(text, "<embedded default.yaml>"), Path.cwd()
    else:
        path = Path(path)
        if not _is_file(path):
            raise ConfigError(f"config: {short_repr(str(path))} does not exist or is not a file; "
                              f"check the path (or omit it to use the embedded default)")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config: cannot read {short_repr(str(path))} "
                              f"({type(exc).__name__}: {shorten(str(exc))}); "
                              f"give a UTF-8 YAML file") from exc
        data, base_dir = parse_yaml(text, shorten(str(path))), path.resolve().parent
    return data, base_dir


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError as exc:  # a name too long for the file system, a loop of links...
        raise ConfigError(f"config: cannot read {short_repr(str(path))} ({type(exc).__name__}: "
                          f"{exc.strerror}); check the path") from exc


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse YAML text into a mapping; syntax errors name line and column. Duplicate keys and
    alias bombs are refused (`ardiff.config.yaml_loader`)."""
    try:
        data = safe_load(text, source)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        raise ConfigError(f"{source}: YAML syntax error at {where}: {shorten(str(exc.problem))}; "
                          f"fix the YAML there") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error: {shorten(str(exc))}") from exc
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
    return with_base_dir(schema.validate(RunConfig, data), base_dir)


def with_rollout(config: RunConfig, **changes: Any) -> RunConfig:
    """A copy of `config` with `rollout` keys changed, validated as the file's would be
    (a `ConfigError` naming `rollout.<key>`); the base folder is kept."""
    try:
        rollout = dataclasses.replace(config.rollout, **changes)
    except ValidationError as exc:
        raise ConfigError(f"rollout.{schema.config_error(exc, RolloutConfig)}") from exc
    return with_base_dir(dataclasses.replace(config, rollout=rollout), config.base_dir)


def with_base_dir(config: RunConfig, base_dir: Path) -> RunConfig:
    """A copy of `config` whose relative paths resolve against `base_dir`.

    `base_dir` is not a key of the file, so `dataclasses.replace(config, ...)` resets it;
    pass what it returns through this to keep the folder.
    """
    config = copy.copy(config)
    object.__setattr__(config, "base_dir", Path(base_dir))
    return config


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` (value parsed as YAML) to nested plain data, in place."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip() or any(part == "" for part in key.strip().split(".")):
        raise ConfigError(f"--set: {short_repr(override)} is not KEY=VALUE; write e.g. "
                          f"--set runtime.kv.window_frames=12")
    parts = key.strip().split(".")
    try:
        value = safe_load(raw, f"--set {shorten(key.strip(), 60)}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {shorten(key, 60)}: {shorten('.'.join(parts[:i + 1]), 60)} "
                              f"is a value, not a section; it cannot hold "
                              f"{short_repr(parts[i + 1])}")
        node = child
    node[parts[-1]] = value

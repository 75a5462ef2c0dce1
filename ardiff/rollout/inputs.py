"""Files and names a rollout reads: prompt lists, action lists, per-stream output paths.

A prompts file and an actions file are checked as the inline values are (valid Unicode, no
NUL: the same one-line error, naming the file and the line or entry); a prompts file may
start with a UTF-8 BOM, dropped as YAML drops it from configs. Actions are checked against
the pipeline's `action_names` before anything loads. A prompt longer than the pipeline's
text length (the optional `max_prompt_tokens` and `count_prompt_tokens(prompt)`) is a
warning naming both lengths, not an error: the pipeline truncates it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ardiff.config import yaml_loader
from ardiff.contract.inputs import get_pipeline_inputs
from ardiff.errors import ConfigError
from ardiff.path_text import check_path_text
from ardiff.text import short_repr, shorten, text_problem

if TYPE_CHECKING:  # pragma: no cover - typing only: streams imports this module
    from ardiff.config.run import RunConfig
    from ardiff.rollout.streams import RolloutPlan


def input_file(field: str, value: object, base_dir: Path) -> Path | None:
    """The file `rollout.prompts` / `rollout.actions` names (`~` expanded, relative to
    `base_dir`), or None when the value is inline. Raises ConfigError for a path string
    no file can have (see `check_path_text`)."""
    return _resolve(value, base_dir, field) if isinstance(value, str) else None


def _resolve(path: str, base_dir: Path, field: str) -> Path:
    check_path_text(field, path)
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base_dir / candidate


def read_prompts(prompts: list[str] | str | None, base_dir: Path) -> list[str] | None:
    """A list of prompts, or a file with one prompt per line (blank lines and #-comments skipped)."""
    if prompts is None or isinstance(prompts, list):
        if prompts == []:
            raise ConfigError("rollout.prompts: the list is empty; give at least one prompt")
        return prompts
    path = _resolve(prompts, base_dir, "rollout.prompts")
    try:
        # Lines end at \n (or \r\n) only: U+2028 or a form feed inside a prompt is text.
        # utf-8-sig: a BOM (as some editors write) is dropped, not made part of the prompt.
        lines = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rollout.prompts: cannot read {str(path)!r} ({exc.__class__.__name__}: "
                          f"{exc}); give a UTF-8 text file with one prompt per line") from exc
    found = []
    for number, line in enumerate(lines, start=1):
        prompt = line.strip()
        if prompt and not prompt.startswith("#"):
            _check_text(f"rollout.prompts ({path}) line {number}", prompt)
            found.append(prompt)
    if not found:
        raise ConfigError(f"rollout.prompts: {str(path)!r} has no prompts; write one per line")
    return found


def read_actions(actions: list | str | None, base_dir: Path,
                 action_names: tuple[str, ...] | None = None,
                 frames_per_block: int | None = None,
                 where: str = "rollout.actions") -> tuple[tuple[str, ...], ...] | None:
    """Per-block actions: an inline list, or a YAML file holding a list (or `actions: [...]`).

    Each entry is one action for every frame of its block, or a list with one
    action per frame. The list repeats when the rollout is longer. With the pipeline's
    `action_names` (`pipeline_actions`), every name must be one of them and a list must
    hold one action or `frames_per_block`; without, any names pass. `where` names the
    value in errors.
    """
    if actions is None:
        return None
    if isinstance(actions, str):
        where, actions = _load_actions_file(_resolve(actions, base_dir, where), where)
    if not isinstance(actions, list) or not actions:
        raise ConfigError(f"{where}: expected a non-empty list of actions, got "
                          f"{short_repr(actions)}")
    entries = tuple(_action_entry(entry, f"{where}[{i}]") for i, entry in enumerate(actions))
    if action_names is not None:
        for i, entry in enumerate(entries):
            _check_actions(entry, f"{where}[{i}]", action_names, frames_per_block)
    return entries


def pipeline_actions(pipeline: Any) -> tuple[str, ...] | None:
    """The actions a pipeline declares (`action_names`: names a request's `actions` may
    hold), or None when it declares none. Raises ConfigError for a malformed declaration."""
    names = getattr(pipeline, "action_names", None)
    if names is None:
        return None
    if (isinstance(names, str) or not isinstance(names, (tuple, list)) or not names
            or not all(isinstance(name, str) and name for name in names)):
        raise ConfigError(f"pipeline: action_names is {short_repr(names)}; it must be a "
                          f"non-empty tuple of action names like ('none', 'left'), or leave it "
                          f"undefined")
    return tuple(names)


def _load_actions_file(path: Path, field: str) -> tuple[str, object]:
    where = f"{field} ({path})"
    try:
        data = yaml_loader.safe_load(path.read_text(encoding="utf-8"), where)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{field}: cannot read {str(path)!r} ({exc.__class__.__name__}"
                          f"); give a UTF-8 YAML file with a list of actions") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: YAML syntax error{at}; fix the file") from exc
    if isinstance(data, dict) and set(data) == {"actions"}:
        data = data["actions"]
    return where, data


def _action_entry(entry: object, where: str) -> tuple[str, ...]:
    if isinstance(entry, str) and entry:
        _check_text(where, entry)
        return (entry,)
    if isinstance(entry, list) and entry and all(isinstance(a, str) and a for a in entry):
        for name in entry:
            _check_text(where, name)
        return tuple(entry)
    raise ConfigError(f"{where}: {short_repr(entry)} is not an action; use a name like left or "
                      f"a list of names, one per frame of the block")


def _check_actions(entry: tuple[str, ...], where: str, action_names: tuple[str, ...],
                   frames_per_block: int | None) -> None:
    for name in entry:
        if name not in action_names:
            raise ConfigError(f"{where}: {short_repr(name)} is not an action of this pipeline; "
                              f"use one of {shorten(', '.join(action_names))}")
    if frames_per_block is not None and len(entry) not in (1, frames_per_block):
        raise ConfigError(f"{where}: {short_repr(list(entry))} is {len(entry)} actions for a "
                          f"block of {frames_per_block} frame(s); give one action for the "
                          f"whole block or one per frame")


def _check_text(where: str, text: str) -> None:
    """The config's rule for text (ardiff.text), for text read from a file."""
    problem = text_problem(text)
    if problem:
        raise ConfigError(f"{where}: {short_repr(text)} {problem}")


def prompt_warnings(pipeline: Any, config: RunConfig, plan: RolloutPlan) -> list[str]:
    """A warning for each prompt of the plan longer than the pipeline's text length, naming
    both lengths; none when the pipeline declares no text length (`max_prompt_tokens` and
    `count_prompt_tokens(prompt) -> int | None`, asked after `load`)."""
    field = "rollout.prompts" if config.rollout.prompts is not None else "rollout.prompt"
    named = {(field, switch.prompt): None for stream in plan.streams
             for switch in stream.schedule}
    named[("rollout.negative_prompt", plan.negative_prompt)] = None
    try:
        return [warning for where, prompt in named
                if (warning := _prompt_warning(pipeline, where, prompt))]
    except Exception as exc:  # noqa: BLE001 - a warning's check must not end the run
        return [f"pipeline: checking the prompts' length raised {type(exc).__name__}: "
                f"{shorten(str(exc))}; they were not checked"]


def ignored_prompt_warnings(pipeline: Any, config: RunConfig) -> list[str]:
    """A warning for each prompt key the config gives when the pipeline declares that it
    ignores prompts (`PipelineInputs.prompt == "ignored"`): the video will not depend on it."""
    inputs = get_pipeline_inputs(pipeline)
    if inputs is None or inputs.takes("prompt"):
        return []
    rollout = config.rollout
    given = {"rollout.prompt": rollout.prompt != "", "rollout.prompts": rollout.prompts is not None,
             "rollout.negative_prompt": rollout.negative_prompt != ""}
    return [ignored_prompt_message(field) for field, is_given in given.items() if is_given]


def ignored_prompt_message(field: str) -> str:
    """The one line for a prompt given to a pipeline that ignores prompts."""
    return (f"{field}: given, but this pipeline ignores prompts (its inputs declare prompt: "
            f"ignored); the video does not depend on it; remove {field}")


def _prompt_warning(pipeline: Any, where: str, prompt: str) -> str | None:
    limit = getattr(pipeline, "max_prompt_tokens", None)
    count = getattr(pipeline, "count_prompt_tokens", None)
    if not (isinstance(limit, int) and not isinstance(limit, bool) and callable(count)):
        return None
    tokens = count(prompt)
    if not isinstance(tokens, int) or tokens <= limit:
        return None
    return (f"{where}: {short_repr(prompt)} is {tokens} tokens, longer than the pipeline's "
            f"text length of {limit} tokens; the model sees only the first {limit}")


def output_path_for(template: str, index: int, num_streams: int) -> Path:
    """The output of stream `index`: `{index}` in the template, or `-<index>` before the suffix.

    `~` is expanded. Raises OutputPathError for a template no path can have (empty, blank,
    a NUL byte)."""
    check_path_text("output.path", template, file_needed=False)
    return _stream_path(template, index, num_streams).expanduser()


def _stream_path(template: str, index: int, num_streams: int) -> Path:
    if "{index}" in template:  # replace, not format: other braces in a name stay as they are
        return Path(template.replace("{index}", str(index)))
    if num_streams == 1:
        return Path(template)
    path = Path(template)
    if template.endswith("/") or not path.suffix:
        return path / f"{index}"
    return path.with_name(f"{path.stem}-{index}{path.suffix}")

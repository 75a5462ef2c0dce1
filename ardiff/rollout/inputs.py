"""Files and names a rollout reads: prompt lists, action lists, per-stream output paths."""

from __future__ import annotations

from pathlib import Path

import yaml

from ardiff.config import yaml_loader
from ardiff.errors import ConfigError
from ardiff.path_text import check_path_text
from ardiff.text import short_repr


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
        lines = path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rollout.prompts: cannot read {str(path)!r} ({exc.__class__.__name__}: "
                          f"{exc}); give a UTF-8 text file with one prompt per line") from exc
    found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not found:
        raise ConfigError(f"rollout.prompts: {str(path)!r} has no prompts; write one per line")
    return found


def read_actions(actions: list | str | None,
                 base_dir: Path) -> tuple[tuple[str, ...], ...] | None:
    """Per-block actions: an inline list, or a YAML file holding a list (or `actions: [...]`).

    Each entry is one action for every frame of its block, or a list with one
    action per frame. The list repeats when the rollout is longer.
    """
    if actions is None:
        return None
    where = "rollout.actions"
    if isinstance(actions, str):
        where, actions = _load_actions_file(_resolve(actions, base_dir, "rollout.actions"))
    if not isinstance(actions, list) or not actions:
        raise ConfigError(f"{where}: expected a non-empty list of actions, got "
                          f"{short_repr(actions)}")
    return tuple(_action_entry(entry, f"{where}[{i}]") for i, entry in enumerate(actions))


def _load_actions_file(path: Path) -> tuple[str, object]:
    where = f"rollout.actions ({path})"
    try:
        data = yaml_loader.safe_load(path.read_text(encoding="utf-8"), where)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rollout.actions: cannot read {str(path)!r} ({exc.__class__.__name__}"
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
        return (entry,)
    if isinstance(entry, list) and entry and all(isinstance(a, str) and a for a in entry):
        return tuple(entry)
    raise ConfigError(f"{where}: {short_repr(entry)} is not an action; use a name like left or "
                      f"a list of names, one per frame of the block")


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

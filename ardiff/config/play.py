"""The `play` section of a run config: which keys steer an action-conditioned pipeline.

    play:
      keys: {left: [left, a], right: [right, d]}   # action -> its keys (default: below)
      idle: none                                    # the action of a tick with no key
    key_map(play, pipeline.action_names)            # -> KeyMap; ConfigError: unknown action

A key is an arrow (`up`, `down`, `left`, `right`), `space`, `enter`, `tab` or one printable
character; `q` and Ctrl-C are reserved (they end the game). Without `keys`, actions named
left/right/up/down get their arrow and W/A/S/D, every other non-idle action a digit 1-9 in
the pipeline's order. Without `idle`, the pipeline's first action is it.
"""

from __future__ import annotations

from dataclasses import dataclass as plain_dataclass
from dataclasses import field

from pydantic import ConfigDict, StrictStr, field_validator
from pydantic.dataclasses import dataclass

from ardiff.errors import ConfigError
from ardiff.text import short_repr

NAMED_KEYS = ("up", "down", "left", "right", "space", "enter", "tab")
QUIT_KEYS = ("q", "ctrl-c")
DIRECTION_KEYS = {"left": ("left", "a"), "right": ("right", "d"), "up": ("up", "w"),
                  "down": ("down", "s")}
DIGIT_KEYS = tuple("123456789")
CHORD = "+"  # actions held together: `w+a` (a pipeline lists the chords it takes)


def check_key(key: str) -> str:
    """A key name as `play.keys` spells it; raises ValueError naming the choices."""
    if key in QUIT_KEYS:
        raise ValueError(f"{key!r} is reserved: it ends ardiff play; choose another key")
    if key in NAMED_KEYS or (len(key) == 1 and key.isprintable() and not key.isspace()):
        return key
    raise ValueError(f"{short_repr(key)} is not a key; use one of {', '.join(NAMED_KEYS)} "
                     f"or one printable character")


@dataclass(frozen=True, config=ConfigDict(extra="forbid", use_attribute_docstrings=True))
class PlayConfig:
    """How `ardiff play` maps keys to the pipeline's actions (None: the defaults)."""

    keys: dict[StrictStr, list[StrictStr]] | None = None
    """Action -> the keys that choose it: arrows (up, down, left, right), space, enter, tab
    or one character; q is reserved."""
    idle: StrictStr | None = None
    """The action of a tick with no key pressed (None: the pipeline's first action)."""

    @field_validator("keys")
    @classmethod
    def _keys_are_keys_used_once(cls, keys: dict[str, list[str]] | None):
        if keys is None:
            return None
        seen: dict[str, str] = {}
        for action, names in keys.items():
            for key in names:
                check_key(key)
                if key in seen:
                    raise ValueError(f"key {key!r} chooses both {seen[key]!r} and {action!r}; "
                                     f"give each key one action")
                seen[key] = action
        return keys


@plain_dataclass(frozen=True)
class KeyMap:
    """Resolved keys: `action_for(key)` is the action a key chooses, None for other keys."""

    actions: tuple[str, ...]                       # the pipeline's, in its order
    idle: str
    keys: dict[str, str] = field(default_factory=dict)  # key -> action

    def action_for(self, key: str) -> str | None:
        return self.keys.get(key)

    def keys_of(self, action: str) -> list[str]:
        return [key for key, chosen in self.keys.items() if chosen == action]

    def combine(self, chosen: list[str]) -> str | None:
        """The action of the keys chosen in one tick: their chord (`w+l`) where the pipeline
        has that action (names joined by `+`, in its order), else the last one chosen."""
        if not chosen:
            return None
        parts = {part for action in chosen for part in action.split(CHORD)}
        for action in self.actions:
            if set(action.split(CHORD)) == parts:
                return action
        return chosen[-1]


def key_map(play: PlayConfig, action_names: tuple[str, ...],
            pipeline_keys: dict[str, list[str]] | None = None) -> KeyMap:
    """The key map for a pipeline with `action_names` (and its own default keys,
    `pipeline_keys`: action -> keys); ConfigError when `play` names an action the pipeline
    does not have."""
    idle = play.idle if play.idle is not None else action_names[0]
    _check_action("play.idle", idle, action_names)
    chosen = play.keys if play.keys is not None else pipeline_keys
    if chosen is None:
        return KeyMap(action_names, idle, _default_keys(action_names, idle))
    keys: dict[str, str] = {}
    for action, names in chosen.items():
        _check_action(f"play.keys.{action}", action, action_names)
        keys.update({key: action for key in names})
    return KeyMap(action_names, idle, keys)


def _default_keys(action_names: tuple[str, ...], idle: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    digits = iter(DIGIT_KEYS)
    for action in action_names:
        if action in DIRECTION_KEYS:
            keys.update({key: action for key in DIRECTION_KEYS[action]})
        elif action != idle:
            digit = next(digits, None)
            if digit is not None:
                keys[digit] = action
    return keys


def _check_action(field_name: str, action: str, action_names: tuple[str, ...]) -> None:
    if action not in action_names:
        raise ConfigError(f"{field_name}: {short_repr(action)} is not an action of this "
                          f"pipeline; use one of {', '.join(action_names)}")

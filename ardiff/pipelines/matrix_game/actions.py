"""Each Matrix-Game 2.0 checkpoint's action space: what a key press means to the model.

The released streaming demo (`pipeline/causal_inference.py::get_current_action`) reads one
action per block and writes it into every video frame of the block; the model reads, per
video frame, a keyboard vector and (universal, gta_drive) a mouse vector [pitch, yaw]:

| mode      | keyboard                                   | mouse (step 0.1)              | idle   |
|-----------|--------------------------------------------|-------------------------------|--------|
| universal | W S A D multi-hot (4)                      | I/K pitch +/-, J/L yaw -/+    | idle   |
| gta_drive | W S (2)                                    | A/D yaw -/+                   | idle   |
| templerun | one-hot of 7: nomove W S Z C A D           | none                          | nomove |

An action is a name: keys joined by `+` in the space's key order (`w+a+l`), `idle` (nothing
pressed) or, for templerun, one key or `nomove`. `ActionSpace.names` lists every name.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ardiff.errors import ConfigError

CAMERA_STEP = 0.1  # the demo's CAM_VALUE: mouse units per video frame of a held camera key
IDLE = "idle"


@dataclass(frozen=True)
class ActionSpace:
    """Keys of one checkpoint: `keyboard` (in the model's vector order), `mouse` keys with
    their [pitch, yaw] moves, whether the keyboard is one-hot (exactly one key, the first
    being the idle one) and which keys exclude each other (a pitch or yaw axis)."""

    mode: str
    keyboard: tuple[str, ...]
    mouse: tuple[tuple[str, tuple[float, float]], ...]
    one_hot: bool
    exclusive: tuple[tuple[str, ...], ...] = ()
    arrows: tuple[str, str, str, str] = ("", "", "", "")  # the keys up / down / left / right
    # also press (`ardiff play`)

    @property
    def play_keys(self) -> dict[str, list[str]]:
        """`ardiff play`'s default keys: each key its own action (and an arrow where set)."""
        arrows = dict(zip(self.arrows, ("up", "down", "left", "right")))
        return {key: [key] + ([arrows[key]] if key in arrows else [])
                for key in self.keys if key != self.idle}

    @property
    def has_mouse(self) -> bool:
        return bool(self.mouse)

    @property
    def keys(self) -> tuple[str, ...]:
        return self.keyboard + tuple(key for key, _ in self.mouse)

    @property
    def idle(self) -> str:
        return self.keyboard[0] if self.one_hot else IDLE

    @property
    def names(self) -> tuple[str, ...]:
        """Every action name, the idle one first."""
        if self.one_hot:
            return self.keyboard + tuple(f"{k}+{m}" for k in self.keyboard for m, _ in self.mouse)
        chords = [c for n in range(1, len(self.keys) + 1)
                  for c in itertools.combinations(self.keys, n) if self._allowed(c)]
        return (IDLE,) + tuple("+".join(chord) for chord in chords)

    def _allowed(self, chord: tuple[str, ...]) -> bool:
        return all(sum(key in group for key in chord) <= 1 for group in self.exclusive)

    def vectors(self, name: str) -> tuple[list[float], list[float]]:
        """(keyboard vector, mouse vector) of action `name`; raises ConfigError."""
        keys = [] if name == IDLE and not self.one_hot else name.split("+")
        unknown = [k for k in keys if k not in self.keys]
        if unknown or (self.one_hot and sum(k in self.keyboard for k in keys) != 1) \
                or len(set(keys)) != len(keys) or not self._allowed(tuple(keys)):
            raise ConfigError(f"rollout.actions: {name!r} is not an action of Matrix-Game "
                              f"{self.mode!r}; use keys {' '.join(self.keys)} joined by '+' "
                              f"(e.g. {self.names[min(2, len(self.names) - 1)]!r}) or "
                              f"{self.idle!r}")
        keyboard = [1.0 if key in keys else 0.0 for key in self.keyboard]
        mouse = [0.0, 0.0]
        for key, (pitch, yaw) in self.mouse:
            if key in keys:
                mouse = [mouse[0] + pitch, mouse[1] + yaw]
        return keyboard, mouse


SPACES = {space.mode: space for space in (
    ActionSpace("universal", ("w", "s", "a", "d"),
                (("i", (CAMERA_STEP, 0.0)), ("k", (-CAMERA_STEP, 0.0)),
                 ("j", (0.0, -CAMERA_STEP)), ("l", (0.0, CAMERA_STEP))),
                one_hot=False, exclusive=(("i", "k"), ("j", "l")), arrows=("i", "k", "j", "l")),
    ActionSpace("gta_drive", ("w", "s"),
                (("a", (0.0, -CAMERA_STEP)), ("d", (0.0, CAMERA_STEP))),
                one_hot=False, exclusive=(("w", "s"), ("a", "d")), arrows=("w", "s", "a", "d")),
    # get_current_action's KEYBOARD_IDX: q (no move) 0, w 1, s 2, z 3, c 4, a 5, d 6
    ActionSpace("templerun", ("nomove", "w", "s", "z", "c", "a", "d"), (), one_hot=True,
                arrows=("w", "s", "a", "d")),
)}

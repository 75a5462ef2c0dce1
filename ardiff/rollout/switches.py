"""Where the switches of a prompt schedule land: `latent_frame` entries in video frames, and
a warning for each switch that does not apply at the frame it asks for.

    resolved = resolve_schedule(schedule, latent_map)       # every entry in video frames
    warnings = switch_warnings(schedule, resolved, walk_blocks(resolved, ...), latent_map)

`latent_map` is (video frames of a session's first latent frame, of each later one), from
the pipeline's `video_frames_first_latent_frame` / `video_frames_per_latent_frame` (None
when it declares neither). causal-Wan, (1, 4), blocks of 3 latent frames:

    latent frames   0  1  2 |  3 ..  5 |  6 ..  8 | ...    latent L > 0 starts at
    video frames    0 .. 8  |  9 .. 20 | 21 .. 32 | ...    video frame 1 + 4 (L - 1)

A switch applies from the first block that starts at or after it (as LongLive's interactive
inference applies its `switch_frame_indices`): one inside a block is moved to the next
boundary, and one past the video's end, or followed by another in the same block, never
applies. Each case is a warning naming the frame asked for and the frame applied.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ardiff.config.run import PromptSwitch
from ardiff.errors import ConfigError

FIELD = "rollout.prompt"


def video_frame(latent_frame: int, latent_map: tuple[int, int]) -> int:
    """The video frame where a session's latent frame `latent_frame` starts."""
    first, per = latent_map
    return 0 if latent_frame == 0 else first + (latent_frame - 1) * per


def latent_frame(video: int, latent_map: tuple[int, int]) -> int:
    """The latent frame starting at video frame `video` (a latent frame's start)."""
    first, per = latent_map
    return 0 if video == 0 else 1 + (video - first) // per


def resolve_schedule(schedule: Sequence[PromptSwitch], latent_map: tuple[int, int] | None
                     ) -> tuple[PromptSwitch, ...]:
    """`schedule` with each `latent_frame` entry given as a `frame`; raises `ConfigError` for
    a pipeline without a latent map, a `latent_frame` after an `on_switch: reset` (the
    latent frames start over there), or video frames that do not increase."""
    resolved = []
    for index, switch in enumerate(schedule):
        if switch.latent_frame is None:
            resolved.append(switch)
            continue
        where = f"{FIELD}[{index}].latent_frame"
        if latent_map is None:
            raise ConfigError(f"{where}: this pipeline declares no latent frames "
                              f"(video_frames_per_latent_frame); give frame: (a video frame) "
                              f"instead")
        if any(earlier.on_switch == "reset" for earlier in schedule[1:index]):
            raise ConfigError(f"{where}: {switch.latent_frame} comes after an on_switch: "
                              f"reset, where the latent frames start over; give frame: (a "
                              f"video frame) instead")
        resolved.append(PromptSwitch(video_frame(switch.latent_frame, latent_map),
                                     switch.prompt, switch.on_switch))
    frames = [switch.position for switch in resolved]
    if any(b <= a for a, b in zip(frames, frames[1:])):
        raise ConfigError(f"{FIELD}: the schedule's video frames {frames} (latent_frame "
                          f"entries converted) must increase strictly; reorder the entries")
    return tuple(resolved)


def switch_warnings(schedule: Sequence[PromptSwitch], resolved: Sequence[PromptSwitch],
                    blocks: Sequence[Slot], latent_map: tuple[int, int] | None) -> list[str]:
    """One warning per switch of `schedule` (as written) that its `resolved` twin does not
    apply at the frame asked for, in the planned `blocks` (`streams.walk_blocks`)."""
    warnings = []
    for index in range(1, len(schedule)):
        asked, switch = schedule[index], resolved[index]
        requested = _requested(asked, switch)
        later = [slot for slot in blocks if slot.start_frame >= switch.position]
        if not later:
            warnings.append(f"{FIELD}[{index}]: the switch at {requested} never applies: the "
                            f"last block starts at {_at(blocks[-1].start_frame, asked, latent_map)}")
        elif later[0].prompt is not switch:
            by = next(i for i, other in enumerate(resolved) if other is later[0].prompt)
            warnings.append(f"{FIELD}[{index}]: the switch at {requested} never applies: "
                            f"{FIELD}[{by}] replaces it in the same block, from "
                            f"{_at(later[0].start_frame, asked, latent_map)}")
        elif later[0].start_frame != switch.position:
            warnings.append(f"{FIELD}[{index}]: the switch at {requested} applies from "
                            f"{_at(later[0].start_frame, asked, latent_map)}, the next block "
                            f"boundary (a switch applies where a block starts)")
    return warnings


def _requested(asked: PromptSwitch, switch: PromptSwitch) -> str:
    if asked.latent_frame is not None:
        return f"latent_frame {asked.latent_frame} (video frame {switch.position})"
    return f"frame {switch.position}"


def _at(start: int, asked: PromptSwitch, latent_map: tuple[int, int] | None) -> str:
    """A block start, in the unit the entry was written in."""
    if asked.latent_frame is not None and latent_map is not None:
        return f"latent frame {latent_frame(start, latent_map)} (video frame {start})"
    return f"frame {start}"


class Slot(Protocol):
    """What is read here of a planned block (`streams.BlockSlot`)."""

    @property
    def start_frame(self) -> int: ...

    @property
    def prompt(self) -> PromptSwitch: ...

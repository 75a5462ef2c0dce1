"""What `ardiff play` shows and reads while a game runs: the tick pacer that picks each
block's action from the keys, the live frame with a status line, the key map in one line,
and the terminal output that outlives its terminal (`TerminalOutput`).

A terminal that goes away mid-game (window closed, ssh dropped) ends the game as SIGHUP
does: the keys or a write notice it, the game's stop is requested with LOST_REASON, and
stdout and stderr go to /dev/null, so the recording is finalised and the exit is 130.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any, Callable, Optional

from ardiff_cli._keys import TerminalLost, is_hung_up

QUIT_KEYS = ("q", "ctrl-c")
KEY_LABELS = {"up": "↑", "down": "↓", "left": "←", "right": "→"}
LOST_REASON = "a lost terminal"  # as in `error: interrupted by a lost terminal`
STREAMS = ("stdout", "stderr")


class Pacer:
    """Chooses each block's actions at its tick: `choose` is LiveBlocks' callback and
    `on_event` the job's (a block's frames set when the next tick starts)."""

    def __init__(self, keys, key_map, fps: float,
                 on_lost: Callable[[], None] = lambda: None) -> None:
        self.keys, self.key_map, self.fps = keys, key_map, fps
        self.on_lost = on_lost  # the terminal is gone: the game's stop is requested there
        self.next_tick = time.perf_counter()
        self.tick_start = self.next_tick
        self.action = key_map.idle
        self.quit = False

    def choose(self, block_index: int) -> Optional[tuple[str, ...]]:
        """This tick's action: the mapped keys of the tick (their chord where the pipeline
        takes it, else the last), else idle; None when a quit key came. A lost terminal
        ends the tick at once, idle (its stop ends the game after it)."""
        chosen: list[str] = []
        while True:
            try:
                keys = self.keys.read(self.next_tick - time.perf_counter())
            except TerminalLost:
                self.on_lost()
                break
            for key in keys:
                if key in QUIT_KEYS:
                    self.quit = True
                    return None
                action = self.key_map.action_for(key)
                if action is not None and action not in chosen:
                    chosen.append(action)
            if time.perf_counter() >= self.next_tick:
                break
        self.tick_start = time.perf_counter()
        self.action = self.key_map.combine(chosen) or self.key_map.idle
        return (self.action,)

    def on_event(self, event) -> None:
        if event.phase == "rollout" and event.block is not None:
            self.next_tick = self.tick_start + int(event.block.frames.shape[0]) / self.fps


class PlayDisplay:
    """The newest frame and a status line, in one Live on stderr."""

    def __init__(self, pacer: Pacer, fps: float) -> None:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.text import Text

        from ardiff_cli import _preview as preview  # numpy: only when a game runs

        self.console = Console(stderr=True)
        self.pacer, self.view, self.status = pacer, preview.FrameView(), Text("loading")
        self.throttle = preview.Throttle(fps)
        self.live = Live(Group(self.view, self.status), console=self.console,
                         auto_refresh=False, transient=True)

    def __enter__(self) -> PlayDisplay:
        self.live.start()
        return self

    def update(self, event) -> None:
        self.pacer.on_event(event)
        if event.phase == "warmup":
            self.status.plain = "warming up"
        elif event.block is not None and self.throttle.ready():
            self.view.show(event.block.frames[-1])
            self.status.plain = (f"frame {event.frames_written} · {self.pacer.action} · "
                                 f"q quits")
        else:
            return
        self.live.refresh()

    def __exit__(self, *exc_info) -> None:
        self.live.stop()


def describe_keys(key_map) -> str:
    """`←/a left · →/d right · (no key) none · q/Ctrl-C quit`: the map, one line."""
    parts = []
    for action in key_map.actions:
        names = [KEY_LABELS.get(key, key) for key in key_map.keys_of(action)]
        if action == key_map.idle:
            names.append("(no key)")
        if names:
            parts.append(f"{'/'.join(names)} {action}")
    return " · ".join(parts + ["q/Ctrl-C quit"])


class TerminalOutput:
    """stdout and stderr, where they are a terminal, guarded while entered: a write that
    fails with EIO (the terminal hung up) calls `lose`, which points both at /dev/null (so
    every later write, and the interpreter's last flush, succeeds unseen) and requests the
    stop `follow` gave it. Other write errors pass through."""

    def __init__(self) -> None:
        self.lost = False
        self._stop: Any = None
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> TerminalOutput:
        gone = False
        for name in STREAMS:
            stream = getattr(sys, name)
            state = terminal_state(stream)
            if state is not None:
                self._saved[name] = stream
                setattr(sys, name, _Guarded(stream, self.lose))
                gone = gone or state == "gone"
        if gone:
            self.lose()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, stream in self._saved.items():
            setattr(sys, name, stream)
        self._saved.clear()

    def follow(self, stop: Any) -> None:
        """Request `stop` (ardiff's RolloutStop) when the terminal goes away."""
        self._stop = stop
        if self.lost:
            stop.request(LOST_REASON)

    def lose(self) -> None:
        """The terminal is gone: stdout and stderr to /dev/null, the stop requested."""
        if not self.lost:
            self.lost = True
            for stream in self._saved.values():
                _to_devnull(stream)
        if self._stop is not None:
            self._stop.request(LOST_REASON)


class _Guarded:
    """A text stream whose EIO on write or flush calls `lose` and is dropped."""

    def __init__(self, stream: Any, lose: Callable[[], None]) -> None:
        self._stream, self._lose = stream, lose

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._lost(exc)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        if exc.errno != errno.EIO:
            raise exc
        self._lose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def terminal_state(stream: Any) -> Optional[str]:
    """`live` or `gone` (hung up) for a terminal, None for anything else."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a test's captured stream
        return None
    return "live" if os.isatty(fd) else "gone" if is_hung_up(fd) else None


def _to_devnull(stream: Any) -> None:
    """Point `stream`'s descriptor at /dev/null; what its buffer holds flushes there."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no descriptor: nothing to point
        pass

"""What `ardiff play` shows and reads while a game runs: the tick pacer that picks each
block's action from the keys, the live frame with a status line, the key map in one line."""

from __future__ import annotations

import time
from typing import Optional

QUIT_KEYS = ("q", "ctrl-c")
KEY_LABELS = {"up": "↑", "down": "↓", "left": "←", "right": "→"}


class Pacer:
    """Chooses each block's actions at its tick: `choose` is LiveBlocks' callback and
    `on_event` the job's (a block's frames set when the next tick starts)."""

    def __init__(self, keys, key_map, fps: float) -> None:
        self.keys, self.key_map, self.fps = keys, key_map, fps
        self.next_tick = time.perf_counter()
        self.tick_start = self.next_tick
        self.action = key_map.idle
        self.quit = False

    def choose(self, block_index: int) -> Optional[tuple[str, ...]]:
        chosen = None
        while True:
            for key in self.keys.read(self.next_tick - time.perf_counter()):
                if key in QUIT_KEYS:
                    self.quit = True
                    return None
                chosen = self.key_map.action_for(key) or chosen
            if time.perf_counter() >= self.next_tick:
                break
        self.tick_start = time.perf_counter()
        self.action = chosen or self.key_map.idle
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

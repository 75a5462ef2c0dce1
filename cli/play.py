"""`ardiff play [CONFIG]`: steer an action-conditioned pipeline from the keyboard, live.

One AR block per tick; a tick lasts the block's frames at the output's frame rate (a
slower model runs block after block). A tick's action is the last mapped key pressed
during it, else the idle action (the config's `play` section, printed at start); `q` or
Ctrl-C ends the game. The run is the rollout job's with a live block source
(ardiff.rollout.live): the video is encoded as it comes, and the action log replays frame
for frame with `ardiff rollout --actions LOG --frames N --seed S`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ardiff.errors import ConfigError
from ardiff_cli import options, signals
from ardiff_cli.errors import handle_errors

DEFAULT_OUTPUT = "ardiff_play.mp4"
MAX_PLAY_FRAMES = 100_000  # ~1.7 h at 16 fps: the default limit of one game
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

        from ardiff_cli import preview  # numpy: only when a game runs

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


def play_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    output: str = typer.Option(DEFAULT_OUTPUT, "--output", "-o", help="The recorded video "
                               "(any rollout format: .mp4 .npy ...)."),
    actions_out: Path = typer.Option(None, "--actions-out", metavar="PATH", help="The action "
                                     "log (default: the video's name + .actions.yaml)."),
    frames: int = typer.Option(MAX_PLAY_FRAMES, "--frames", help="Most video frames to play."),
    seed: int = typer.Option(None, "--seed", help="Noise seed (names the world)."),
    fps: float = typer.Option(None, "--fps", help="Ticks follow this playback frame rate."),
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    overrides: options.OverrideList = options.SetOpt,
    debug: bool = options.DebugOpt,
) -> None:
    """Play an action-conditioned pipeline from the keyboard (no CONFIG: the embedded default).

    Needs a terminal. The video and the action log are written when the game ends (q,
    Ctrl-C, or --frames reached); SIGTERM and SIGHUP end it too, exit 130.
    """
    from ardiff_cli import play_session  # imports the runtime

    with signals.StopSignals() as stop_signals:
        with handle_errors(debug):
            run_config = options.load_run_config(config, overrides, {
                "output.path": output, "rollout.frames": frames, "rollout.seed": seed,
                "output.fps": fps, "runtime.device": device, "runtime.dtype": dtype})
            session = play_session.PlaySession(run_config, config, actions_out)
            _check_terminal()
            print(f"keys: {describe_keys(session.key_map)}", file=sys.stderr)
            result = session.run(stop_signals)
        stop_signals.hold()
        play_session.finish(session, result, _replay_args(config, overrides, device, dtype),
                            debug)


def _check_terminal() -> None:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise ConfigError("ardiff play: needs a terminal (stdin and stderr are not both "
                          "TTYs); to run actions without one, use ardiff rollout --actions "
                          "FILE")


def _replay_args(config: Optional[Path], overrides, device, dtype) -> list[str]:
    """What the replay command repeats of this one: the config, --set, device and dtype."""
    args = [] if config is None else [str(config)]
    for override in overrides or []:
        args += ["--set", override]
    for flag, value in (("--device", device), ("--dtype", dtype)):
        if value is not None:
            args += [flag, value]
    return args

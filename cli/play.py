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
from pathlib import Path
from typing import Optional

import typer

from ardiff.errors import ConfigError
from ardiff_cli import _options as options
from ardiff_cli import _signals as signals
from ardiff_cli._errors import handle_errors
from ardiff_cli._help import FROM_CONFIG
from ardiff_cli._play_display import LOST_REASON, TerminalOutput, describe_keys, terminal_state

DEFAULT_OUTPUT = "ardiff_play.mp4"
MAX_PLAY_FRAMES = 100_000  # ~1.7 h at 16 fps: the default limit of one game


def play_command(
    config: options.OptionalPath = options.OptionalConfigArg,
    output: str = typer.Option(DEFAULT_OUTPUT, "--output", "-o", help="The recorded video "
                               "(any rollout format: .mp4 .npy ...)."),
    actions_out: Path = typer.Option(None, "--actions-out", metavar="PATH", help="The action "
                                     "log.", show_default="the video's name + .actions.yaml"),
    frames: int = typer.Option(MAX_PLAY_FRAMES, "--frames", help="Most video frames to play."),
    seed: int = typer.Option(None, "--seed", show_default=FROM_CONFIG, help="Noise seed (names the world)."),
    fps: float = typer.Option(None, "--fps", show_default=FROM_CONFIG, help="Ticks follow this playback frame rate."),
    device: str = options.DeviceOpt,
    dtype: str = options.DtypeOpt,
    overrides: options.OverrideList = options.SetOpt,
    debug: bool = options.DebugOpt,
) -> None:
    """Play an action-conditioned pipeline from the keyboard (no CONFIG: the embedded default).

    Needs a terminal. The video and the action log are written when the game ends (q,
    Ctrl-C, or --frames reached); SIGTERM, SIGHUP and the terminal going away (window
    closed, ssh dropped) end it too, exit 130.
    """
    from ardiff_cli import _play_session as play_session  # imports the runtime

    with signals.StopSignals() as stop_signals, TerminalOutput() as terminal:
        with handle_errors(debug):
            run_config = options.load_run_config(config, overrides, {
                "output.path": output, "rollout.frames": frames, "rollout.seed": seed,
                "output.fps": fps, "runtime.device": device, "runtime.dtype": dtype})
            session = play_session.PlaySession(run_config, config, actions_out)
            _check_terminal(terminal)
            print(f"keys: {describe_keys(session.key_map)}", file=sys.stderr)
            result = session.run(stop_signals, terminal)
        stop_signals.hold()
        play_session.finish(session, result, _replay_args(config, overrides, device, dtype),
                            debug)


def _check_terminal(terminal: TerminalOutput) -> None:
    if terminal.lost or terminal_state(sys.stdin) == "gone":  # it was one, and went away
        raise KeyboardInterrupt(LOST_REASON)
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

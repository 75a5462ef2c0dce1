"""One game of `ardiff play`: checked before it starts, run, then its recording written.

    session = PlaySession(run_config, config_path, actions_out)   # refuses bad input
    report = session.run(stop_signals)
    finish(session, report, replay_args, debug)                    # log, summary, exit

Refused before anything runs (exit 2, one line): a pipeline that declares no actions,
a `play` section naming actions it does not have, a video or action log path that is
another written or read file (ardiff.rollout.paths) or sits in a missing folder.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Optional

from ardiff.config.play import key_map
from ardiff.errors import ConfigError
from ardiff.text import short_repr
from ardiff_cli import _options as options
from ardiff_cli._run_report import finish_run

LOG_SUFFIX = ".actions.yaml"


def action_log_path(output: str, actions_out: Optional[Path]) -> Path:
    """`--actions-out`, or the video's path with `.actions.yaml` for its suffix
    (`play.mp4` -> `play.actions.yaml`, a folder `frames/` -> `frames.actions.yaml`)."""
    if actions_out is not None:
        return actions_out.expanduser()
    path = Path(output).expanduser()
    base = path.with_suffix("") if path.suffix else path
    return base.parent / (base.name + LOG_SUFFIX)


class PlaySession:
    """The checked inputs of one game: config, key map, where the log goes."""

    def __init__(self, run_config: Any, config_path: Optional[Path],
                 actions_out: Optional[Path]) -> None:
        from ardiff.engine.loader import build_pipeline
        from ardiff.rollout.live import pipeline_actions

        self.config, self.config_path = run_config, config_path
        pipeline = build_pipeline(run_config.pipeline, run_config.base_dir)
        names = pipeline_actions(pipeline)
        if names is None:
            raise ConfigError(f"pipeline: {short_repr(run_config.pipeline.entry)} declares no "
                              f"actions (no action_names); ardiff play needs an "
                              f"action-conditioned pipeline, such as the default one")
        self.key_map = key_map(run_config.play, names, getattr(pipeline, "play_keys", None))
        self.log_path = action_log_path(run_config.output.path, actions_out)
        # The video and the log: writable, distinct, and none of the files the game reads.
        options.check_command_paths(run_config, config_path,
                                    written=[("--actions-out", self.log_path)], pipeline=pipeline)
        self.blocks = None

    def run(self, stop_signals: Any, output: Any) -> Any:
        """Play until q, Ctrl-C, a stop signal, the terminal going away (`output`, a
        TerminalOutput) or `rollout.frames`; returns the report."""
        from ardiff.rollout.job import run_rollout  # one process: a game is not a parallel job
        from ardiff.rollout.live import LiveBlocks
        from ardiff.rollout.stop import RolloutStop
        from ardiff_cli._keys import TerminalKeys, TerminalLost
        from ardiff_cli._play_display import LOST_REASON, Pacer, PlayDisplay

        stop = RolloutStop()
        stop_signals.follow(stop)
        output.follow(stop)
        fps = self.config.output.fps
        try:
            with TerminalKeys(sys.stdin.fileno()) as keys:
                pacer = Pacer(keys, self.key_map, fps, on_lost=output.lose)
                self.blocks = LiveBlocks(pacer.choose)
                with PlayDisplay(pacer, fps) as display:
                    report = run_rollout(self.config, on_event=display.update, stop=stop,
                                         blocks=self.blocks)
        except TerminalLost:  # gone before the game began: nothing played, nothing to keep
            output.lose()
            raise KeyboardInterrupt(LOST_REASON) from None
        report.frames_requested = report.frames_written  # a game asks for what was played
        return report


def finish(session: PlaySession, report: Any, replay_args: list[str], debug: bool) -> None:
    """Write the action log, say how to replay it, then the rollout's summary and exit."""
    log_error = None
    if session.blocks is not None and session.blocks.log:
        log_error = _write_log(session, report, replay_args)
    else:
        print("nothing was played: no action log written", file=sys.stderr)
    finish_run(report, None, False, debug, log_error)


def _write_log(session: PlaySession, report: Any, replay_args: list[str]) -> Optional[str]:
    from ardiff.rollout.live import write_action_log

    replay = shlex.join(["ardiff", "rollout", *replay_args, "--seed",
                         str(session.config.rollout.seed), "--frames",
                         str(report.frames_written), "--actions", str(session.log_path),
                         "-o", "replay.npy"])
    comment = ["ardiff play: the action of each AR block, in order. Replay it frame for frame:",
               f"  {replay}"]
    error = options.write_output_file(
        "--actions-out", session.log_path, "the action log",
        lambda path: write_action_log(path, session.blocks.log, comment))
    if error is not None:
        return error
    print(f"actions: {session.log_path} ({len(session.blocks.log)} blocks); replay: {replay}",
          file=sys.stderr)
    return None

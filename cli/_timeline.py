"""`ardiff rollout --timeline PATH`: one JSON line per block (ardiff.rollout.block_log).

    timeline = Timeline(path)               # None: no timeline; `follow` passes events on
    run_job(config, on_event=timeline.follow(on_event))
    error = timeline.write()                # the file, whole; why it failed, else None

The file is written once the run ends (a stop or a failure included), whole: a reader sees
no half-written line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from ardiff_cli import _options as options


class Timeline:
    def __init__(self, path: Optional[Path]) -> None:
        from ardiff.rollout.block_log import BlockLog

        self.path, self.log = path, BlockLog()

    def follow(self, on_event: Callable[[Any], None]) -> Callable[[Any], None]:
        if self.path is None:
            return on_event

        def both(event: Any) -> None:
            self.log.record(event)
            on_event(event)
        return both

    def write(self) -> Optional[str]:
        if self.path is None:
            return None
        text = "".join(json.dumps(record) + "\n" for record in self.log.records)
        path = self.path.expanduser()
        try:
            options.write_whole(path, text)
        except (OSError, TimeoutError) as exc:
            return (f"--timeline: cannot write {str(path)!r} ({type(exc).__name__}: {exc}); "
                    f"the video is kept; check free disk space and permissions")
        return None

"""How a run's end is written on its report: a failure (`failed`, with the error's exit
code and one line) or an interrupt (`interrupted by SIGTERM`, exit 130). Never re-raises."""

from __future__ import annotations

from ardiff.errors import EXIT_FAILED, EXIT_INTERRUPTED, ArdiffError
from ardiff.rollout.report import RolloutReport


def record_failure(report: RolloutReport, exc: BaseException) -> None:
    """What went wrong, as the report says it: KeyboardInterrupt is `interrupted` (by the
    signal named in its message, if any), anything else `failed`; never re-raises."""
    if isinstance(exc, KeyboardInterrupt):
        if report.frames_requested and report.frames_written >= report.frames_requested:
            by = f" by {exc}" if str(exc) else ""
            report.warnings.append(f"interrupted{by} after every frame was written: the "
                                   f"pipeline's session cleanup was cut short")
            return
        record_interrupt(report, str(exc))
        return
    report.status = "failed"
    report.exit_code = exc.exit_code if isinstance(exc, ArdiffError) else EXIT_FAILED
    report.error = _describe(exc)
    report.exception = exc


def record_interrupt(report: RolloutReport, reason: str) -> None:
    """`interrupted`, or `interrupted by SIGTERM` when there is a reason."""
    by = f" by {reason}" if reason else ""
    report.status, report.exit_code = "interrupted", EXIT_INTERRUPTED
    report.error = f"interrupted{by}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ArdiffError):
        return str(exc)
    if isinstance(exc, SystemExit):  # outside generate_block, e.g. in a hook
        return (f"the pipeline called exit({exc.code!r}); a pipeline must raise an exception, "
                f"not exit the process")
    return f"{type(exc).__name__}: {exc}"

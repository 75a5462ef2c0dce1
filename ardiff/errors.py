"""Typed errors of ardiff.

Every error a user can cause is one of these classes. Each carries the exit
code the command line uses for it (docs/design.md#7-command-line-and-exit-codes):

    0 ok · 1 the run failed · 2 bad usage, config or spec · 3 does not fit · 130 interrupted

Messages name the field, the value, the rule and the fix, on one line.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1        # the run failed after it started (partial output kept)
EXIT_USAGE = 2         # bad usage, config or spec
EXIT_CAPACITY = 3      # does not fit in memory
EXIT_INTERRUPTED = 130  # Ctrl-C / a signal



class ArdiffError(Exception):
    """Base of every ardiff error. `exit_code` is what the CLI exits with."""

    exit_code = EXIT_FAILED


class ConfigError(ArdiffError, ValueError):
    """A run config, a CLI option or a `--set` override is invalid."""

    exit_code = EXIT_USAGE


class SpecError(ConfigError):
    """A KV-cache spec (or a runtime override of it) breaks a rule."""


class PipelineLoadError(ConfigError):
    """The pipeline entry point cannot be found, built or does not fit the protocol."""


class OutputPathError(ConfigError):
    """The output path cannot be written (checked before any compute)."""


class CapacityError(ArdiffError):
    """Not even one session fits in the memory budget."""

    exit_code = EXIT_CAPACITY


class RunError(ArdiffError):
    """The run failed after it started (partial output is kept)."""

    exit_code = EXIT_FAILED


class KVStateError(RunError):
    """A pipeline used the KV state API wrongly (shape, layer order, closed state...)."""


class SessionError(RunError):
    """A session was used in a way its lifecycle does not allow."""


class BlockOutputError(RunError):
    """A pipeline returned a `BlockOutput` that breaks the contract."""


class PipelineError(RunError):
    """A pipeline hook raised; the original exception is the `__cause__`."""


class WarmupError(RunError):
    """Warmup raised or did not give back every page."""


class EncoderError(RunError):
    """The video encoder failed (disk full, codec missing...)."""


class ArdiffWarning(UserWarning):
    """Something ardiff did as asked but the user may not expect (a prompt the pipeline
    ignores, a warmup that failed): issued by the Python API, kept in its `warnings`."""

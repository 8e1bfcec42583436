"""One exception type for bad user input, so the CLI can print it as a single line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


class ConfigError(ValueError):
    """A configuration value that cannot work.

    The message must name the offending value and say how to fix it, in one line. ``lit_icl.cli.main``
    prints it as ``lit_icl: error: <message>`` and exits with status 2 before anything is written.
    """


def run_command(body: Callable[[], Path]) -> int:
    """Run a data-building command's ``body``; print ``wrote <path>`` and return 0, or print a
    :class:`ConfigError` as the CLI does (``lit_icl: error: <message>`` on stderr) and return 2."""
    try:
        path = body()
    except ConfigError as err:
        print(f"lit_icl: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


class TrainingDiverged(ConfigError):
    """A training run whose loss or weights stopped being finite (``lit_icl.callbacks.finite.FiniteGuard``).

    Unlike other :class:`ConfigError` s it is raised during training, after the run folder exists; it is one
    so that the CLI prints it the same way (one line, exit status 2). The guard raises it before a checkpoint
    with non-finite weights is written; its message names the step and what to change (usually the learning
    rate).
    """

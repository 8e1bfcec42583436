"""The exceptions the CLI prints as a single line: bad user input (:class:`ConfigError`, exit status 2) and output
the environment would not let a run write (:class:`StorageError`, a full disk, exit status 74)."""

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


#: Exit status of a run stopped by its storage (a full disk, a quota, a read-only or failing file system): 74,
#: ``EX_IOERR`` of BSD's ``sysexits.h``. Not 2, which says the command line is wrong and rerunning it cannot help:
#: here it is right, and the same command (resumed) succeeds once there is space. Not 1, a crash with a traceback
#: (a bug to report). A grid driver or scheduler can tell the three apart by the status alone.
EXIT_STORAGE = 74


class StorageError(OSError):
    """Output the run could not write because of its environment, not its input: a full disk (``ENOSPC``), a
    quota, a file system that refuses the write.

    The message names the path, the cause and the fix in one line (free space, then resume from the newest
    complete checkpoint); ``lit_icl.cli.main`` prints it as ``lit_icl: error: <message>`` and exits with
    :data:`EXIT_STORAGE`. It is an ``OSError``, so code that catches those around a save still does.
    """

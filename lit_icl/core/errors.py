"""One exception type for bad user input, so the CLI can print it as a single line."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot work.

    The message must name the offending value and say how to fix it, in one line. ``lit_icl.cli.main``
    prints it as ``lit_icl: error: <message>`` and exits with status 2 before anything is written.
    """

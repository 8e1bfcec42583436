"""Sizes far too large for the machine, refused in one line before a run writes anything.

A net sized beyond the machine fails in its constructor, which the CLI reports in one line
(:func:`lit_icl.cli.messages.out_of_memory_message`). Generated data is another matter: a data module builds
nothing in its constructor, and a batch of a billion prompts (or of prompts a billion tokens long) would fail
only when the first batch is drawn, after the run folder exists, with a traceback. So each data module lists
what its sizes make it hold at once (:class:`DataPiece`: one batch of each split, a set kept in memory) and
refuses, in its constructor, a piece larger than the machine's memory (:func:`check_data_fits`).

The pieces count the tensors a batch hands to the model and nothing else (no generation temporaries, no model
activations), so they are lower bounds: a refused size could never run, and no size that could is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lit_icl.core.errors import ConfigError

__all__ = ["TOO_LARGE", "DataPiece", "check_data_fits", "gib", "machine_memory"]

#: What every refusal of a size beyond the machine says, the data's here and a net's at build.
TOO_LARGE = "a size in the config is far too large for this machine"

#: cgroup v2's memory limit of this process's container ("max" when there is none).
_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB with one decimal, e.g. ``"12.5 GiB"``."""
    return f"{nbytes / 2**30:.1f} GiB"


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the physical memory, or a container's lower limit; ``None`` where
    the system does not say (then nothing is refused)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system that reports it
        return None
    try:
        limit = _CGROUP_LIMIT.read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


@dataclass(frozen=True)
class DataPiece:
    """Data a run holds at once: ``what`` it is (``"one training batch"``), its ``nbytes`` and the ``sizes`` that
    make it that large, as options (``"batch_size=2000 prompts of 101 tokens x 33 values"``)."""

    what: str
    nbytes: int
    sizes: str


def check_data_fits(pieces: Iterable[DataPiece], limit: int | None = None) -> None:
    """Refuse the largest of ``pieces`` if it is larger than ``limit`` bytes (default: :func:`machine_memory`).

    One :class:`ConfigError` naming the piece, the GiB it would need and the sizes behind it.
    """
    limit = machine_memory() if limit is None else limit
    largest = max(pieces, key=lambda piece: piece.nbytes, default=None)
    if limit is None or largest is None or largest.nbytes <= limit:
        return
    raise ConfigError(f"{TOO_LARGE}: {largest.what} would need {gib(largest.nbytes)} ({largest.sizes}), and it has "
                      f"{gib(limit)} of memory; lower those sizes")

"""Option types the benchmark scripts share (imported from beside them, as they import each other): a count or an
amount that measures nothing (``--steps 0``, ``--warmup -1``, ``--budget 0``) is refused by argparse itself, before
any work starts, in one ``error:`` line that names the option, the bound and the value, with exit status 2.

    parser.add_argument("--steps", type=at_least(1), default=60)
    parser.add_argument("--budget", type=more_than(0, float, " seconds"), default=None)

A value that is not a number at all gets argparse's usual ``invalid int value: 'x'``. Checks between options
(``--warmup`` below ``--steps``) stay in the scripts, after parsing."""

from __future__ import annotations

import argparse
import operator
from collections.abc import Callable


def at_least(least: float, kind: type = int, note: str = "") -> Callable[[str], float]:
    """An argparse ``type``: a ``kind`` (``int`` or ``float``) of ``least`` or more; ``note`` follows the bound in
    the refusal (``" seconds"``, ``" (or left out for all)"``)."""
    return _bounded(kind, operator.ge, f"at least {least}{note}", least)


def more_than(bound: float, kind: type = float, note: str = "") -> Callable[[str], float]:
    """An argparse ``type``: a ``kind`` above ``bound`` (a NaN is refused too); ``note`` as in :func:`at_least`."""
    return _bounded(kind, operator.gt, f"more than {bound}{note}", bound)


def _bounded(kind: type, holds: Callable[[float, float], bool], bound_words: str,
             bound: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)  # a ValueError: argparse's own "invalid <kind> value"
        if not holds(value, bound):
            raise argparse.ArgumentTypeError(f"must be {bound_words}, got {text}")
        return value

    parse.__name__ = kind.__name__  # what argparse names in "invalid int value: 'x'"
    return parse

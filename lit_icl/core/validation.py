"""Checks for constructor arguments, and the run-level consistency check the CLI calls before writing.

Every shipped module, data module, net and callback validates its arguments in ``__init__`` with these
checkers, so bad input stops the CLI with one line ``lit_icl: error: <message>`` (exit status 2) before any
run folder exists. Each checker raises :class:`~lit_icl.core.errors.ConfigError` with a message that names
the option, the bad value and what would work, and returns the (normalised) value so a constructor can write::

    self.lr = check_positive("lr", lr)
    lo, hi = check_pair_ordered("pose_scale", pose_scale, low=0.0, low_inclusive=False)

Checks that involve two objects (a net built for 100-point episodes, a data module producing 20-point ones)
cannot run in either constructor. An object that needs such a check defines ``check_config(*, trainer,
model, datamodule)``; :func:`check_run_config` calls it on the data module, the LightningModule, every
submodule of it (the nets), and every trainer callback, right after the CLI instantiated them and before it
starts the run (see ``lit_icl.cli.LitICLCLI.instantiate_classes``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from numbers import Integral, Real
from typing import Any, Literal, get_args, get_origin

from lit_icl.core.errors import ConfigError

__all__ = [
    "check_choice",
    "check_finite_tree",
    "check_fraction",
    "check_int",
    "check_nonempty",
    "check_nonnegative",
    "check_pair_ordered",
    "check_positive",
    "check_range",
    "check_run_config",
    "check_unique",
]


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _require_number(name: str, value: Any, integer: bool) -> None:
    if integer and not _is_int(value):
        raise ConfigError(f"{name}={value!r} must be an integer")
    if not integer and not _is_real(value):
        raise ConfigError(f"{name}={value!r} must be a number")
    if not integer and not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} must be a finite number")


def check_int(name: str, value: Any, minimum: int | None = None, hint: str = "") -> int:
    """An integer (not a bool) that is ``>= minimum`` if given; returns it as ``int``."""
    _require_number(name, value, integer=True)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}{_hint(hint)}")
    return int(value)


def check_positive(name: str, value: Any, integer: bool = False, hint: str = "") -> Any:
    """A finite number ``> 0`` (an integer ``>= 1`` with ``integer=True``)."""
    _require_number(name, value, integer)
    if not value > 0:
        raise ConfigError(f"{name}={value} must be {'>= 1' if integer else '> 0'}{_hint(hint)}")
    return int(value) if integer else float(value)


def check_nonnegative(name: str, value: Any, integer: bool = False, hint: str = "") -> Any:
    """A finite number ``>= 0`` (an integer with ``integer=True``)."""
    _require_number(name, value, integer)
    if not value >= 0:
        raise ConfigError(f"{name}={value} must be >= 0{_hint(hint)}")
    return int(value) if integer else float(value)


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    integer: bool = False,
    hint: str = "",
) -> Any:
    """A finite number in the interval from ``low`` to ``high`` (either end open or absent)."""
    _require_number(name, value, integer)
    ok_low = low is None or (value >= low if low_inclusive else value > low)
    ok_high = high is None or (value <= high if high_inclusive else value < high)
    if not (ok_low and ok_high):
        raise ConfigError(
            f"{name}={value} must lie in {_interval(low, high, low_inclusive, high_inclusive)}{_hint(hint)}"
        )
    return int(value) if integer else float(value)


def check_fraction(name: str, value: Any, *, closed_high: bool = False, hint: str = "") -> float:
    """A fraction in ``(0, 1)`` (``(0, 1]`` with ``closed_high=True``)."""
    return check_range(name, value, 0.0, 1.0, low_inclusive=False, high_inclusive=closed_high, hint=hint)


def check_bool(name: str, value: Any) -> bool:
    """``True`` or ``False`` (not ``1``, not ``"yes"``): jsonargparse refuses others on the command line, this
    refuses them from Python."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be true or false")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """One of ``choices`` (compared with ``==``)."""
    options = list(choices)
    if value not in options:
        listed = ", ".join(repr(c) for c in options)
        raise ConfigError(f"{name}={value!r} is not a valid choice; choose one of {listed}")
    return value


def check_literal(name: str, value: Any, choices: Any) -> Any:
    """One of the values of a ``Literal[...]`` type (``choices``), read with ``typing.get_args``.

    Options are typed ``Literal[...]`` so that ``--help`` lists them and jsonargparse refuses others at parse
    time; this check refuses them when the class is built from Python, with the choices written only once, in
    the type. A ``Literal`` alias of aliases (``Literal[A, B]`` of ``Literal``s) is flattened.
    """
    return check_choice(name, value, literal_choices(choices))


def literal_choices(choices: Any) -> tuple[Any, ...]:
    """The values of a ``Literal[...]`` type, flattening nested ``Literal``s; a ``TypeError`` for anything else."""
    if get_origin(choices) is not Literal:
        raise TypeError(f"{choices!r} is not a Literal[...] type")
    out: list[Any] = []
    for arg in get_args(choices):
        out.extend(literal_choices(arg) if get_origin(arg) is Literal else [arg])
    return tuple(out)


def check_nonempty(name: str, values: Any, example: str = "") -> list[Any]:
    """A non-string sequence with at least one element; returns it as a list."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(f"{name}={values!r} must be a list{_hint(f'e.g. {example}' if example else '')}")
    out = list(values)
    if not out:
        raise ConfigError(f"{name} is empty; give at least one value{_hint(f'e.g. {example}' if example else '')}")
    return out


def check_unique(name: str, values: Sequence[Any]) -> list[Any]:
    """A sequence without repeated elements (metrics and logs are keyed by value); returns it as a list."""
    seen: list[Any] = []
    for v in values:
        if v in seen:
            raise ConfigError(f"{name}={list(values)} repeats {v!r}; list each value once")
        seen.append(v)
    return seen


def check_pair_ordered(
    name: str,
    pair: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    strict: bool = False,
) -> tuple[float, float]:
    """A ``(low, high)`` pair of finite numbers with ``first <= second`` (``<`` with ``strict=True``).

    ``low`` / ``high`` bound both entries (e.g. ``low=0, low_inclusive=False`` for a positive range).
    """
    if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable):
        raise ConfigError(f"{name}={pair!r} must be a (low, high) pair")
    items = list(pair)
    if len(items) != 2:
        raise ConfigError(f"{name}={items} must be a (low, high) pair of two numbers")
    a, b = items
    for part, v in (("low", a), ("high", b)):
        _require_number(f"{name} {part}", v, integer=False)
    if (a >= b) if strict else (a > b):
        relation = "<" if strict else "<="
        raise ConfigError(f"{name}=({a}, {b}) must be (low, high) with low {relation} high; swap the two values")
    bounds = _interval(low, high, low_inclusive, high_inclusive)
    for v in (a, b):
        if (low is not None and not (v >= low if low_inclusive else v > low)) or (
            high is not None and not (v <= high if high_inclusive else v < high)
        ):
            raise ConfigError(f"{name}=({a}, {b}): both ends must lie in {bounds}")
    return float(a), float(b)


def non_finite_entries(tree: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every float in a nested config that is ``nan`` or ``±inf``, as ``(dotted key, value)`` in tree order.

    ``tree`` is what a parser returns: mappings (dicts, jsonargparse ``Namespace`` s, read through ``vars``),
    lists and tuples (an index becomes ``key[i]``), and scalars. Keys are joined with dots as on the command
    line (``model.init_args.net.init_args.width``).
    """
    out: list[tuple[str, float]] = []
    if isinstance(tree, float):
        if not math.isfinite(tree):
            out.append((prefix, tree))
    elif isinstance(tree, dict) or type(tree).__name__ == "Namespace":  # jsonargparse's, without importing it
        items = tree.items() if isinstance(tree, dict) else vars(tree).items()
        for key, value in items:
            out.extend(non_finite_entries(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            out.extend(non_finite_entries(value, f"{prefix}[{i}]"))
    return out


def check_finite_tree(tree: Any, prefix: str = "") -> None:
    """Refuse a config that holds a non-finite float anywhere (``.nan`` / ``.inf`` in YAML, ``nan`` in a list).

    One shared check after parsing, so no constructor's range check has to remember that ``nan`` compares false
    with everything (``nan <= 1`` and ``nan >= 0`` are both false, and ``not (x > 0)`` style checks let it pass).
    """
    bad = non_finite_entries(tree, prefix)
    if bad:
        key, value = bad[0]
        more = f" (and {len(bad) - 1} more: {', '.join(k for k, _ in bad[1:4])})" if len(bad) > 1 else ""
        raise ConfigError(
            f"{key}={value} is not a finite number{more}; give a finite value (YAML's .nan/.inf and nan/inf are "
            "refused in every config)"
        )


def check_run_config(trainer: Any, model: Any, datamodule: Any) -> None:
    """Cross-object checks, before a run writes anything: ``check_config`` of every object that has one.

    Called on the data module, the LightningModule and each of its submodules (nets; ``model.modules()``
    starts with the model itself), and each trainer callback, in that order. Each hook receives
    ``trainer=``, ``model=`` and ``datamodule=`` (any may be ``None``) and raises ``ConfigError``.
    """
    objects: list[Any] = [datamodule]
    if model is not None:
        objects.extend(model.modules() if hasattr(model, "modules") else [model])
    if trainer is not None:
        objects.extend(getattr(trainer, "callbacks", None) or [])
    seen: set[int] = set()
    for obj in objects:
        hook = getattr(obj, "check_config", None)
        if obj is None or id(obj) in seen or not callable(hook):
            continue
        seen.add(id(obj))
        hook(trainer=trainer, model=model, datamodule=datamodule)


def _hint(text: str) -> str:
    return f"; {text}" if text else ""


def _interval(low: float | None, high: float | None, low_inclusive: bool, high_inclusive: bool) -> str:
    left = ("[" if low_inclusive else "(") + ("-inf" if low is None else f"{low:g}")
    right = ("inf" if high is None else f"{high:g}") + ("]" if high_inclusive else ")")
    if low is None:
        left = "(-inf"
    if high is None:
        right = "inf)"
    return f"{left}, {right}"

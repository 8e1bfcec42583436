"""``implements(obj, Protocol)``: the papers' contract checks, the same on every Python the package supports.

Each paper states what its LightningModule expects of a net or data module as a ``runtime_checkable``
``Protocol`` (``lit_icl/<paper>/contracts.py``). ``isinstance(obj, SomeProtocol)`` checks that the members
exist, but from Python 3.12 on it looks them up statically (``inspect.getattr_static``), which never calls
``__getattr__``. An ``nn.Module`` keeps its submodules, parameters and buffers in ``_modules``,
``_parameters`` and ``_buffers`` and serves them through ``__getattr__``, so on 3.12+ a net whose ``head`` is a
submodule fails ``isinstance(net, AVMNISTNet)`` although ``net.head`` works (on 3.10/3.11 it passes). The
modules therefore check contracts with :func:`implements`, which looks members up the way the code that uses
them does: with ``getattr``.
"""

from __future__ import annotations

import functools
import inspect
from typing import TypeGuard, TypeVar

from lit_icl.core.errors import ConfigError

T = TypeVar("T")

# What ``typing.Protocol`` itself puts into a protocol's class body; not members of the contract.
_PROTOCOL_MACHINERY = frozenset({"__init__", "__init_subclass__", "__subclasshook__", "__class_getitem__"})


@functools.cache  # checked on every batch by some modules; a protocol's members never change
def protocol_members(protocol: type) -> tuple[frozenset[str], frozenset[str]]:
    """``(attributes, methods)`` a protocol declares, its protocol bases' included.

    Attributes are the annotated names and properties; methods are the functions (class and static methods
    included) defined in the class bodies, public names plus dunders such as ``__call__``.
    """
    if not getattr(protocol, "_is_protocol", False):
        raise TypeError(f"{protocol!r} is not a typing.Protocol")
    attributes: set[str] = set()
    methods: set[str] = set()
    for cls in protocol.__mro__:
        if not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue  # object, Generic, Protocol itself
        attributes.update(inspect.get_annotations(cls))
        for name, value in vars(cls).items():
            if name in _PROTOCOL_MACHINERY or (name.startswith("_") and not name.startswith("__")):
                continue
            if name.startswith("__") and not inspect.isfunction(value):
                continue  # __doc__, __module__, __protocol_attrs__, ...
            if isinstance(value, property):
                attributes.add(name)  # read like an attribute
            elif isinstance(value, (classmethod, staticmethod)) or inspect.isfunction(value):
                methods.add(name)
    return frozenset(attributes), frozenset(methods - attributes)


def implements(obj: object, protocol: type[T]) -> TypeGuard[T]:
    """Whether ``obj`` has every member of ``protocol`` (methods callable), found through ``getattr``, and each
    method takes the protocol's arguments by their names.

    What ``isinstance(obj, protocol)`` means for a ``runtime_checkable`` protocol on Python 3.10/3.11, on every
    version: members an ``nn.Module`` serves through ``__getattr__`` count (see the module docstring). The
    argument names are checked too, because a member's name alone does not tell two papers' nets apart: an
    Omniglot classifier's ``forward(images, context_labels, noise)`` is no regression net's ``forward(xs, ys, xq)``.
    """
    attributes, methods = protocol_members(protocol)
    missing = object()
    return all(hasattr(obj, name) for name in attributes) and all(
        callable(getattr(obj, name, missing)) and _takes(type(obj), name, protocol) for name in methods
    )


@functools.cache
def _parameter_names(function: object) -> frozenset[str] | None:
    """The names a function can be called with (``self`` left out); ``None`` when it takes ``**kwargs`` or its
    signature cannot be read (a builtin): then any name is taken."""
    try:
        parameters = inspect.signature(function).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return frozenset(name for name, p in parameters.items()
                     if name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL)


@functools.cache  # per class: the check runs on every batch in some modules
def _takes(cls: type, name: str, protocol: type) -> bool:
    """Whether ``cls``'s method ``name`` takes every argument name of ``protocol``'s method ``name``."""
    declared = next((vars(c)[name] for c in protocol.__mro__ if name in vars(c)), None)  # see _declared
    own = getattr(cls, name, None)
    if declared is None or own is None:  # an instance attribute: its signature is the object's business
        return True
    wanted, taken = _parameter_names(inspect.unwrap(declared)), _parameter_names(own)
    return wanted is None or taken is None or wanted <= taken


def unmet(obj: object, protocol: type) -> list[str]:
    """What ``obj`` lacks of ``protocol``, one phrase per member, in the order the protocol's members sort;
    empty exactly when :func:`implements` holds. For refusals that tell a user extending the package what to add
    (``no attribute method``, ``forward(x, y, x_query) does not take xs, xq``)."""
    attributes, methods = protocol_members(protocol)
    missing = object()
    problems = [f"no attribute {name}" for name in sorted(attributes) if not hasattr(obj, name)]
    for name in sorted(methods):
        member = getattr(obj, name, missing)
        if member is missing:
            problems.append(f"no method {name}")
        elif not callable(member):
            problems.append(f"{name} is not callable")
        elif not _takes(type(obj), name, protocol):
            own = getattr(type(obj), name)
            taken = _parameter_names(own) or frozenset()
            wanted = inspect.signature(inspect.unwrap(_declared(protocol, name))).parameters  # type: ignore[arg-type]
            absent = [arg for arg in wanted if arg != "self" and arg not in taken]
            problems.append(f"{name}{_plain_signature(own)} does not take {', '.join(absent)}")
    return problems


def contract_summary(protocol: type) -> str:
    """The protocol's members as a user would write them: ``method: str, forward(xs, ys, xq=None)``."""
    attributes, methods = protocol_members(protocol)
    annotations: dict[str, object] = {}
    for cls in reversed(protocol.__mro__):
        if getattr(cls, "_is_protocol", False) and cls.__module__ != "typing":
            annotations.update(inspect.get_annotations(cls))
    parts = [f"{name}: {annotations[name]}" if name in annotations else name for name in sorted(attributes)]
    parts += [f"{name}{_plain_signature(_declared(protocol, name))}" for name in sorted(methods)]
    return ", ".join(parts)


def data_refusal(datamodule: object, protocol: type, module: str, shipped: str) -> ConfigError:
    """The one-line refusal of a data module that lacks what ``module`` reads of it (``protocol``): each unmet member,
    the whole contract for a data module of one's own, and the shipped data module to use instead."""
    return ConfigError(
        f"{type(datamodule).__name__} lacks what {module} reads: {'; '.join(unmet(datamodule, protocol))} (a data "
        f"module of your own needs {contract_summary(protocol)}: {protocol.__module__}.{protocol.__qualname__}); or "
        f"use {shipped}")


def _declared(protocol: type, name: str) -> object:
    """The function a protocol (or one of its protocol bases) declares as ``name``."""
    return next(vars(c)[name] for c in protocol.__mro__ if name in vars(c))


def _plain_signature(function: object) -> str:
    """``(xs, ys, xq=None)``: the parameters without ``self`` and annotations; ``(...)`` when unreadable."""
    try:
        parameters = inspect.signature(inspect.unwrap(function)).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"
    plain = [p.replace(annotation=inspect.Parameter.empty) for name, p in parameters.items() if name != "self"]
    return f"({', '.join(str(p) for p in plain)})"


__all__ = ["contract_summary", "data_refusal", "implements", "protocol_members", "unmet"]

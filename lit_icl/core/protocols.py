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
    declared = next((vars(c)[name] for c in protocol.__mro__ if name in vars(c)), None)
    own = getattr(cls, name, None)
    if declared is None or own is None:  # an instance attribute: its signature is the object's business
        return True
    wanted, taken = _parameter_names(inspect.unwrap(declared)), _parameter_names(own)
    return wanted is None or taken is None or wanted <= taken


__all__ = ["implements", "protocol_members"]

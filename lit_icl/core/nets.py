"""Small helpers about nets that every paper uses."""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
from pathlib import PurePath
from typing import Any

import torch
from torch import Tensor, nn


class RecordsConstruction(type):
    """The metaclass of a net that remembers how it was built, in the form a config gives a net.

    ``net_config(net)`` is ``{"class_path": ..., "init_args": {...}}`` with every ``__init__`` argument (defaults
    included); a net given to it as an argument is written the same way, nested. A module given such a net in Python
    rather than through a config keeps this in its hyper-parameters
    (:meth:`lit_icl.core.module.ICLModule.save_reloadable_hparams`), so ``load_from_checkpoint`` rebuilds that very
    net, as it does a config's. The class's own ``__init__`` is left as it is (the CLI reads its signature).
    """

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> None:
        super().__init__(name, bases, namespace)
        # inspect.signature(cls) would otherwise show this metaclass's __call__: show __init__'s, as for any class.
        init = inspect.signature(cls.__init__)
        cls.__signature__ = init.replace(parameters=list(init.parameters.values())[1:])

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        net = super().__call__(*args, **kwargs)
        signature = inspect.signature(cls.__init__)  # not inspect.signature(cls): that would be this __call__'s
        bound = signature.bind(net, *args, **kwargs)
        bound.apply_defaults()
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        names = [n for n in list(signature.parameters)[1:] if signature.parameters[n].kind not in variadic]
        init_args = {name: config_value(bound.arguments[name]) for name in names}
        # A config names each argument: one given through *args or **kwargs cannot be written back.
        complete = all(value is not UNWRITABLE for value in init_args.values()) and not any(
            bound.arguments.get(n) for n in signature.parameters if signature.parameters[n].kind in variadic)
        net.__dict__["_built_with"] = {"class_path": public_path(cls), "init_args": init_args} if complete else None
        return net


class RecordedNet(nn.Module, metaclass=RecordsConstruction):
    """An ``nn.Module`` whose construction is recorded (:class:`RecordsConstruction`): the base of the papers' nets."""


#: An argument that a config cannot hold (a tensor, a net whose construction was not recorded).
UNWRITABLE = object()


def config_value(value: Any) -> Any:
    """``value`` as a config writes it: nets as ``{"class_path", "init_args"}`` (:func:`net_config`), lists, tuples
    and string-keyed dicts item by item, paths as strings; :data:`UNWRITABLE` for anything a config cannot hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [config_value(v) for v in value]
        return UNWRITABLE if any(v is UNWRITABLE for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: config_value(v) for k, v in value.items()}
        return UNWRITABLE if any(v is UNWRITABLE for v in items.values()) else items
    if isinstance(value, nn.Module):
        config = net_config(value)
        return UNWRITABLE if config is None else config
    return UNWRITABLE


def net_config(net: nn.Module) -> dict[str, Any] | None:
    """How ``net`` was built, as a config writes it (``{"class_path", "init_args"}``), or ``None`` when that is not
    known: a class that records nothing, or an argument no config can hold (see :class:`RecordsConstruction`)."""
    record = net.__dict__.get("_built_with")
    return copy.deepcopy(record) if record is not None else None


@functools.cache
def public_path(cls: type) -> str:
    """The shortest import path of ``cls`` (``lit_icl.icssl.GDICLHead`` rather than ``lit_icl.icssl.nets.heads...``),
    the one configs use and that survives moving the file within its package."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = ".".join(parts[:end])
        try:
            if getattr(importlib.import_module(module), cls.__qualname__, None) is cls:
                return f"{module}.{cls.__qualname__}"
        except ImportError:
            continue
    return f"{cls.__module__}.{cls.__qualname__}"


def count_parameters(net: nn.Module) -> int:
    """Trainable scalars of ``net``: what the papers' parameter counts (CoQE Sec. 5.2, MMCA Table 1, IC-SSL App. H)
    count."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


class _ContiguousGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        return grad.contiguous()


def contiguous_grad(x: Tensor) -> Tensor:
    """``x`` itself, whose gradient is handed back contiguous.

    A parameter that a net uses transposed (``W.mT``, or stacked and then transposed) gets its gradient as a
    transposed view, and autograd copies that into the parameter's layout after the backward: two eager ops per
    parameter at every step, outside any compiled graph, where each is a launch on a GPU. Passed through this
    where it is used, the parameter's gradient is made contiguous inside the backward (inside its compiled graph,
    where the kernel that computes it writes it in that layout). The values are the same, bit for bit.
    """
    return _ContiguousGrad.apply(x)


def holds_net(value: Any) -> bool:
    """Whether ``value`` is a net or a list, tuple or dict holding one (what a module's hyper-parameters must not
    keep as objects)."""
    if isinstance(value, nn.Module):
        return True
    if isinstance(value, (list, tuple)):
        return any(holds_net(v) for v in value)
    if isinstance(value, dict):
        return any(holds_net(v) for v in value.values())
    return False

"""Count the places where a GPU run's host would wait for the device, on any device, the CPU included.

A CUDA step is fast when the host queues its kernels and moves on. It waits whenever a value computed on the
device has to reach Python: ``item()``, ``bool()``/``float()`` of a tensor, ``tolist()``, ``numpy()``, and the ops
whose output *size* depends on values (``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``, ...).
``torch.cuda.set_sync_debug_mode`` catches these on a GPU; :class:`HostReads` finds the same calls on the CPU,
where every test and benchmark of this project runs, so a sync added to a training step fails a CPU test
instead of waiting for the next GPU to show it as lost speed.

Two layers see them:

- a ``TorchDispatchMode`` sees the aten ops below autograd, each once (:data:`SYNC_OPS`, and ``index`` /
  ``index_put_`` with a boolean mask);
- ``Tensor.tolist``, ``Tensor.numpy`` and ``Tensor.cpu`` are wrapped while the mode is active, because on the
  CPU they reach no kernel (on a GPU each is a copy to the host).

``.cpu()`` is counted even where the tensor is already on the host (every tensor is, on the CPU): a census
counts the calls a GPU run makes, and a deliberate copy (e.g. to solve ``eigh`` on the host) counts too. Reads
made while a ``DataLoader`` makes a batch are not counted: its tensors are on the host in a GPU run as well.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNC_OPS", "HostReads", "host_reads", "not_counted"]

#: > 0 while :func:`not_counted` is active.
_quiet = 0

#: aten ops that read device values on the host (their result is a Python value or has a data-dependent size).
SYNC_OPS: frozenset[str] = frozenset({
    "_local_scalar_dense",  # item(), bool(t), float(t), int(t), if t: ...
    "is_nonzero",
    "equal",
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "bincount",  # its length is max(input) + 1
    "histogram",
})

#: Tensor methods that copy to the host without reaching a CPU kernel.
_HOST_METHODS: tuple[str, ...] = ("tolist", "numpy", "cpu")


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


class HostReads(TorchDispatchMode):
    """While active, counts the calls that would make a CUDA host wait for its device, by name.

    ``counts`` maps ``aten.nonzero`` / ``aten.index[mask]`` / ``Tensor.tolist`` ... to the number of calls;
    :attr:`total` is their sum. ``repeat_interleave`` with a tensor of repeats counts unless it is given
    ``output_size``. Use it as a context manager (:func:`host_reads`) or enter and exit it around hooks.
    """

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        #: With ``sites=True``: ``(kind, "file:line in function")`` -> calls, the caller outside torch.
        self.sites: Counter[tuple[str, str]] | None = Counter() if sites else None
        self._saved: dict[str, Callable[..., Any]] = {}

    def _count(self, kind: str) -> None:
        if _quiet or _in_data_loader():
            return  # a DataLoader makes its batches on the host in a GPU run too: no device is waited for
        self.counts[kind] += 1
        if self.sites is not None:
            self.sites[(kind, _caller())] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if name in SYNC_OPS:
            self._count(f"aten.{name}")
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and len(args) > 1:
            if any(_is_mask(i) for i in (args[1] or ())):
                self._count(f"aten.{name}[mask]")
        elif func is torch.ops.aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            # The output's length is sum(repeats), read on the host unless the caller gives it.
            self._count("aten.repeat_interleave(no output_size)")
        return func(*args, **kwargs)

    def __enter__(self) -> HostReads:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        for method in _HOST_METHODS:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original
            setattr(torch.Tensor, method, self._counted(method, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for method, original in self._saved.items():
                setattr(torch.Tensor, method, original)
            self._saved.clear()

    def _counted(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self._count(f"Tensor.{method}")
            return original(tensor, *args, **kwargs)

        return wrapper


def _in_data_loader() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if "/torch/utils/data/" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _caller() -> str:
    """The innermost frame outside torch and this module: the line that asked for the host read."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and name != __file__ and "/contextlib.py" not in name:
            return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@contextmanager
def not_counted() -> Iterator[None]:
    """Reads made inside are not counted: for calls that read values on the CPU only.

    ``F.one_hot(x, num_classes)`` is one: on a CPU it checks ``x.min()`` and ``x.max()`` with two reads, on CUDA
    it leaves the check to a device-side assert.
    """
    global _quiet
    _quiet += 1
    try:
        yield
    finally:
        _quiet -= 1


@contextmanager
def host_reads(sites: bool = False) -> Iterator[HostReads]:
    """``with host_reads() as reads: ...`` then ``reads.counts``: the host reads of the block.

    ``sites=True`` also records where each read was asked for (``reads.sites``), at some cost per read.
    """
    mode = HostReads(sites=sites)
    with mode:
        yield mode


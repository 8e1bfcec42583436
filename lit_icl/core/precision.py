"""Keeping numerically delicate code in float32 under mixed precision."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)


def float32_region(fn: F) -> F:
    """Decorator: run ``fn`` with autocast disabled on CPU and CUDA.

    Distances, Gram matrices, power iterations and eigen-solvers lose their meaning in bf16; code inside a
    region should also cast its inputs with ``.float()``, since tensors produced under autocast may be bf16.
    """
    return torch.autocast("cuda", enabled=False)(torch.autocast("cpu", enabled=False)(fn))  # type: ignore[return-value]

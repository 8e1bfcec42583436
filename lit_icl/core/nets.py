"""Small helpers about nets that every paper uses."""

from __future__ import annotations

import torch
from torch import Tensor, nn


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

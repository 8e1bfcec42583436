"""``lit_icl.core.nets``: helpers every paper's nets use."""

from __future__ import annotations

import pytest
import torch

from lit_icl.core.nets import contiguous_grad


@pytest.mark.parametrize("use", ["batched product", "sum"])
def test_contiguous_grad_hands_back_the_same_gradient_in_the_parameters_layout(use: str) -> None:
    """A parameter used transposed gets the gradient it would get anyway, bit for bit, already in its own layout
    (so autograd has nothing to copy after the backward); the forward value is the parameter itself."""
    gen = torch.Generator().manual_seed(0)
    other = torch.randn(2, 5, 4, generator=gen) if use == "batched product" else torch.randn(2, 3, 5, generator=gen)

    def loss(w: torch.Tensor) -> torch.Tensor:  # both as in IC-SSL's Eq. (16): C_h^T B_h and I + S^T
        return ((w.mT @ other) if use == "batched product" else (other + w.mT)).square().sum()

    plain, routed = (torch.randn(2, 5, 3, generator=gen).requires_grad_() for _ in range(2))
    with torch.no_grad():
        routed.copy_(plain)
    arrived = {}
    for name, p in (("plain", plain), ("routed", routed)):
        p.register_hook(lambda g, name=name: arrived.__setitem__(name, g.stride()))
    loss(plain).backward()
    through = contiguous_grad(routed)
    assert torch.equal(through, routed)
    loss(through).backward()
    assert arrived == {"plain": (15, 1, 5), "routed": (15, 3, 1)}  # a transposed view; the parameter's own layout
    assert torch.equal(routed.grad, plain.grad)

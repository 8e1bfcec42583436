"""Small helpers about nets that every paper uses."""

from __future__ import annotations

from torch import nn


def count_parameters(net: nn.Module) -> int:
    """Trainable scalars of ``net``: what the papers' parameter counts (CoQE Sec. 5.2, MMCA Table 1, IC-SSL App. H)
    count."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad)

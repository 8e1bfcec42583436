"""The causal Transformer both CoQE experiments share: Chan et al.'s positional encoding and causality."""

from __future__ import annotations

import torch

from lit_icl.coqe.layers import CausalTransformer, sinusoidal_positions


def test_sinusoidal_positions_formula() -> None:
    pe = sinusoidal_positions(17, 64, 30.0)
    p, i = 5, 3
    w = 30.0 ** (-2 * i / 64)
    assert pe.shape == (17, 64)
    assert abs(pe[p, i].item() - torch.tensor(p * w).sin().item()) < 1e-6
    assert abs(pe[p, 32 + i].item() - torch.tensor(p * w).cos().item()) < 1e-6


def test_transformer_uses_sdpa_causally() -> None:
    torch.manual_seed(0)
    tf = CausalTransformer(16, depth=2, heads=4).eval()
    x = torch.randn(3, 7, 16)
    y = tf(x)
    x2 = x.clone()
    x2[:, 4:] += torch.randn(3, 3, 16)
    y2 = tf(x2)
    torch.testing.assert_close(y[:, :4], y2[:, :4])
    assert not torch.allclose(y[:, 4:], y2[:, 4:])

"""The causal Transformer that both CoQE experiments build on (CoQE paper App. C.1, C.2; Chan et al. 2022).

- :class:`CausalTransformer`: pre-LN blocks with causal ``scaled_dot_product_attention``, GELU MLP, final LN;
  the Omniglot task encoder and baseline (:mod:`lit_icl.coqe.omniglot.nets`) and the regression task encoder
  and GPT-2-style baseline (:mod:`lit_icl.coqe.regression.nets`) are stacks of it;
- :func:`sinusoidal_positions`: Chan et al.'s positional encoding (``max_time`` 30, ``[sin ; cos]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.validation import check_int

#: Width of the Transformer tokens (App. C.2: "Both variants use an embedding dimension of 64").
TOKEN_WIDTH = 64


def sinusoidal_positions(n: int, dim: int, max_time: float = 30.0) -> Tensor:
    """Chan et al.'s sinusoidal encoding, ``(n, dim)``: ``[sin(p w_i) ; cos(p w_i)]``, ``w_i = max_time^(-2i/dim)``.

    The halves are concatenated, not interleaved, and the base is 30 rather than 10^4 because sequences are
    short (17 tokens).
    """
    if dim % 2:
        raise ConfigError(f"positional encoding width {dim} must be even")
    freqs = max_time ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention`` (flash/efficient kernels)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        check_int("heads", heads, minimum=1)
        if width % heads:
            raise ConfigError(f"width={width} is not divisible by heads={heads}; choose heads dividing the width")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``mask``: optional boolean ``(n, n)`` (True = may attend) replacing the causal mask."""
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(d_head)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, n, w))


class TransformerBlock(nn.Module):
    """Pre-LN residual block: ``x + attn(LN(x))``, then ``x + MLP(LN(x))`` with a GELU MLP of ``mlp_ratio * width``."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class CausalTransformer(nn.Module):
    """``depth`` causal pre-LN blocks and a final LayerNorm: ``(B, n, width) -> (B, n, width)``.

    The output at position ``p`` depends only on inputs ``<= p`` (tested), which is what lets one pass train
    every prefix and what CoQE's task encoder relies on.
    """

    def __init__(self, width: int = TOKEN_WIDTH, depth: int = 12, heads: int = 8, mlp_ratio: int = 4):
        super().__init__()
        for name, value in (("width", width), ("depth", depth), ("mlp_ratio", mlp_ratio)):
            check_int(name, value, minimum=1)
        self.blocks = nn.ModuleList([TransformerBlock(width, heads, mlp_ratio) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(width)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``mask``: optional boolean ``(n, n)`` attention mask (True = may attend) instead of the causal one."""
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x)

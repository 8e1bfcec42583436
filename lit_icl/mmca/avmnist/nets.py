"""Nets of the corrupted-avMNIST experiment (Sec. 7, Table 1; App. I.2-I.4): plain ``nn.Module``s.

- :class:`ConvTokenizer` (App. I.2): one modality's 28x28 (or any size) map -> 16 tokens in ``R^d``.
- :class:`MultimodalCrossAttention` (App. I.3): the "full paper-inspired model" and its three ablations,
  selected by ``cross_attention`` and ``injection``. A fixed sequence ``X = [c; X_I; X_A]`` (CLS, 16 image and 16
  audio tokens) and an evolving state ``F_t``:

  ``F_0 = X W_0^T + b_0``;
  ``A_{t-1} = MHA_t(LN(F_{t-1}), LN(X), LN(X))`` (cross-attention; self-attention on ``LN(F_{t-1})`` in the
  ablation without it); ``F~_t = F_{t-1} + A_{t-1}``;
  ``S_{t-1} = sigmoid(F~_t W_G^T + b_G) * (X W_S^T + b_S)`` (gated re-injection; 0 in the ablation without it);
  ``F-_t = F~_t + S_{t-1}``; ``F_t = F-_t + FFN_t(LN(F-_t))``; logits = head(``F_T[CLS]``).
- :class:`BidirectionalCrossAttention` (App. I.4): two streams (image, audio) that cross-attend to each other,
  mean-pooled and concatenated for the head (Lu et al., 2019).

Parameter counts (d = 16, T = 10, 4 heads, d_h = 32, conv width 16) against Table 1, measured by
``sum(p.numel())`` and asserted in ``tests/mmca/avmnist/test_nets.py``:

========================  ========  ==========  =======
model                      ours      Table 1     diff
========================  ========  ==========  =======
full                       43,754    4.36e4      +0.35 %
no injection               38,314    3.82e4      +0.30 %
no cross-attention         43,722    4.36e4      +0.28 %
no inj. & no cross-attn    38,282    3.82e4      +0.21 %
bi-directional CA          60,746    6.07e4      +0.08 %
========================  ========  ==========  =======

Choices App. I leaves open, fixed so that all five counts sit within 1 % of Table 1 (why, in the README's
avMNIST section): 3x3 convolutions with padding 1 and bias, the last one mapping the conv width to ``d``;
head = LN -> Linear(., d_h) -> GELU -> dropout -> Linear(d_h, 10); *one* ``LN(X)`` shared by all layers (X is
fixed, so it is normalised once; a separate ``LN`` per layer would add 320 parameters and make the full model
larger than the no-cross-attention one, which Table 1 lists at the same 4.36e4); in the two-stream baseline one
``LN`` per stream per layer whose output serves both as that stream's queries and as the other's keys/values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.validation import check_int, check_range

N_CLASSES = 10
GRID = 4  # adaptive pooling grid: 4 x 4 = 16 tokens per modality (App. I.2; "g = 4" in I.5)


def pooling_windows(n_in: int, n_out: int) -> list[tuple[int, int]]:
    """The ``n_out`` windows ``[floor(i n_in / n_out), ceil((i + 1) n_in / n_out))`` into which adaptive average
    pooling cuts an axis of ``n_in`` positions (they overlap when ``n_out`` does not divide ``n_in``: 7 -> 4 gives
    ``[0, 2), [1, 4), [3, 6), [5, 7)``)."""
    return [((i * n_in) // n_out, -(-(i + 1) * n_in // n_out)) for i in range(n_out)]


def window_average(x: Tensor, size: int) -> Tensor:
    """``adaptive_avg_pool2d(x, size)`` written with ops whose CUDA backward is deterministic.

    CUDA's backward of adaptive average pooling adds into the input's gradient with atomics, and under
    ``torch.use_deterministic_algorithms(True)`` it raises instead (torch has no deterministic version). Here a
    map whose sides ``size`` divides is averaged by ``avg_pool2d`` over non-overlapping windows (its CUDA backward
    gathers); any other map by the mean of each window's rows, then of each window's columns, over static slices
    (:func:`pooling_windows`), whose backward is padding and adding. Both give the same windows and averages as
    adaptive pooling, up to the rounding of the sums' order.

    ``(B, C, H, W) -> (B, C, size, size)``.
    """
    h, w = x.shape[-2:]
    if h % size == 0 and w % size == 0:
        return F.avg_pool2d(x, (h // size, w // size))
    rows = torch.stack([x[..., a:b, :].mean(-2) for a, b in pooling_windows(h, size)], dim=-2)
    return torch.stack([rows[..., a:b].mean(-1) for a, b in pooling_windows(w, size)], dim=-1)


class GridPool(nn.Module):
    """Adaptive average pooling to a ``size x size`` grid (``nn.AdaptiveAvgPool2d(size)``), deterministic on CUDA.

    On a CUDA tensor it pools with :func:`window_average`, so ``deterministic: true`` trains this net on a GPU
    (adaptive pooling's CUDA backward has no deterministic kernel). Elsewhere it is torch's adaptive pooling
    itself, so CPU runs keep their numbers to the bit. It has no state: checkpoints are unchanged.
    """

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type == "cuda":
            return window_average(x, self.size)
        return F.adaptive_avg_pool2d(x, self.size)

    def extra_repr(self) -> str:
        return f"size={self.size}"


class ConvTokenizer(nn.Module):
    """App. I.2: conv-ReLU x2, 2x2 max-pool, conv-ReLU x2, 2x2 max-pool, adaptive avg-pool to 4x4, flatten, LN.

    ``(B, 1, H, W) -> (B, 16, d)``; any ``H, W >= 4`` works (avMNIST images are 28x28; audio 28x28 or 112x112).
    """

    def __init__(self, d: int = 16, width: int = 16):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, d, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            GridPool(GRID),  # adaptive average pooling, deterministic on CUDA too
        )
        self.norm = nn.LayerNorm(d)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != 1:
            raise ValueError(f"expected (B, 1, H, W) maps, got shape {tuple(x.shape)}")
        z = self.body(x)  # (B, d, 4, 4)
        return self.norm(z.flatten(2).transpose(1, 2))  # (B, 16, d): row-major grid cells as tokens


class FeedForward(nn.Module):
    """Pointwise two-layer MLP with GELU and dropout, hidden width ``d_h`` (the ``FFN_t`` of App. I.3)."""

    def __init__(self, d: int, d_hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, d_hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(d_hidden, d),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _head(d_in: int, d_hidden: int, dropout: float) -> nn.Sequential:
    """Classifier: LN, then a two-layer MLP with GELU and dropout (App. I.3, last paragraph; I.4)."""
    return nn.Sequential(
        nn.LayerNorm(d_in),
        nn.Linear(d_in, d_hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(d_hidden, N_CLASSES),
    )


def _check_sizes(d: int, depth: int, heads: int, d_hidden: int, conv_width: int, dropout: float) -> None:
    check_int("d", d, minimum=1)
    check_int("depth", depth, minimum=1)
    check_int("heads", heads, minimum=1)
    check_int("d_hidden", d_hidden, minimum=1)
    check_int("conv_width", conv_width, minimum=1)
    check_range("dropout", dropout, 0.0, 1.0, low_inclusive=True, high_inclusive=False, hint="0 means none")
    if d % heads:
        raise ConfigError(f"d={d} must be divisible by heads={heads} (each head gets d / heads dimensions)")


class _Tokens(nn.Module):
    """Both tokenizers with the learned positional (``P_I, P_A``) and, optionally, modality (``M_I, M_A``)
    embeddings of App. I.2."""

    def __init__(self, d: int, conv_width: int, modality_embeddings: bool):
        super().__init__()
        n = GRID * GRID
        self.image = ConvTokenizer(d, conv_width)
        self.audio = ConvTokenizer(d, conv_width)
        self.pos_image = nn.Parameter(torch.randn(n, d) * 0.02)
        self.pos_audio = nn.Parameter(torch.randn(n, d) * 0.02)
        if modality_embeddings:
            self.mod_image = nn.Parameter(torch.randn(1, d) * 0.02)
            self.mod_audio = nn.Parameter(torch.randn(1, d) * 0.02)
        else:
            self.mod_image = self.mod_audio = None

    def forward(self, image: Tensor, audio: Tensor) -> tuple[Tensor, Tensor]:
        xi = self.image(image) + self.pos_image
        xa = self.audio(audio) + self.pos_audio
        if self.mod_image is not None:
            xi = xi + self.mod_image
            xa = xa + self.mod_audio
        return xi, xa


class FusionLayer(nn.Module):
    """One layer ``F_{t-1} -> F_t`` of App. I.3 (attention update, optional gated re-injection, FFN; pre-LN)."""

    def __init__(
        self, d: int, heads: int, d_hidden: int, dropout: float, cross_attention: bool, injection: bool
    ):
        super().__init__()
        self.cross_attention = cross_attention
        self.norm_state = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        if injection:
            self.inject = nn.Linear(d, d)  # W^S_{t-1}, b^S_{t-1}
            self.gate = nn.Linear(d, d)  # W^G_{t-1}, b^G_{t-1}
        else:
            self.inject = self.gate = None
        self.norm_ffn = nn.LayerNorm(d)
        self.ffn = FeedForward(d, d_hidden, dropout)

    def forward(self, f: Tensor, x: Tensor, x_norm: Tensor | None) -> Tensor:
        q = self.norm_state(f)
        kv = x_norm if self.cross_attention else q  # CA to the fixed X, or self-attention on F
        a, _ = self.attn(q, kv, kv, need_weights=False)
        f = f + a  # F~_t
        if self.inject is not None:
            f = f + torch.sigmoid(self.gate(f)) * self.inject(x)  # + S_{t-1}: the gate reads F~_t
        return f + self.ffn(self.norm_ffn(f))


class MultimodalCrossAttention(RecordedNet):
    """The paper-inspired model of App. I.3 and its ablations (Table 1 rows 1-4).

    Args:
        cross_attention: attend from ``LN(F)`` to ``LN(X)`` (True) or self-attend on ``LN(F)`` (False).
        injection: add the gated re-injection ``S_t`` of ``X`` in every layer.
        d: token dimension (16). depth: layers ``T`` (10). heads: attention heads (4).
        d_hidden: FFN and head hidden width ``d_h`` (32). dropout: 0.1. conv_width: tokenizer channels (16).
    """

    def __init__(
        self,
        cross_attention: bool = True,
        injection: bool = True,
        d: int = 16,
        depth: int = 10,
        heads: int = 4,
        d_hidden: int = 32,
        dropout: float = 0.1,
        conv_width: int = 16,
    ):
        super().__init__()
        _check_sizes(d, depth, heads, d_hidden, conv_width, dropout)
        self.d, self.depth = d, depth
        self.cross_attention, self.injection = bool(cross_attention), bool(injection)
        self.tokens = _Tokens(d, conv_width, modality_embeddings=True)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.init_state = nn.Linear(d, d)  # W_0, b_0
        # X is the same in every layer, so LN(X) is computed once, by one LN (see the module docstring).
        self.norm_x = nn.LayerNorm(d) if self.cross_attention else None
        self.layers = nn.ModuleList(
            FusionLayer(d, heads, d_hidden, dropout, self.cross_attention, self.injection)
            for _ in range(depth)
        )
        self.head = _head(d, d_hidden, dropout)

    @property
    def method(self) -> str:
        """Row label: ``full``, ``no_injection``, ``no_cross_attention`` or ``no_injection_no_cross_attention``."""
        parts = [
            p
            for p, on in (("no_injection", self.injection), ("no_cross_attention", self.cross_attention))
            if not on
        ]
        return "_".join(parts) if parts else "full"

    def sequence(self, image: Tensor, audio: Tensor) -> Tensor:
        """The fixed multimodal sequence ``X = concat(c, X_I^(0), X_A^(0))``, ``(B, 33, d)``."""
        xi, xa = self.tokens(image, audio)
        return torch.cat([self.cls.expand(xi.shape[0], -1, -1), xi, xa], dim=1)

    def represent(self, image: Tensor, audio: Tensor) -> Tensor:
        """``h = F_T[CLS]``, ``(B, d)``."""
        x = self.sequence(image, audio)
        f = self.init_state(x)  # F_0 = X W_0^T + 1 b_0^T (not 0 as in the theory)
        x_norm = self.norm_x(x) if self.norm_x is not None else None
        for layer in self.layers:
            f = layer(f, x, x_norm)
        return f[:, 0]

    def forward(self, image: Tensor, audio: Tensor) -> Tensor:
        """Logits ``(B, 10)``."""
        return self.head(self.represent(image, audio))


class BiLayer(nn.Module):
    """One layer of the two-stream baseline (App. I.4): each stream cross-attends to the other, then its FFN."""

    def __init__(self, d: int, heads: int, d_hidden: int, dropout: float):
        super().__init__()
        self.norm_u, self.norm_v = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn_u = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)  # MHA^I_t
        self.attn_v = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)  # MHA^A_t
        self.norm_ffn_u, self.norm_ffn_v = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn_u = FeedForward(d, d_hidden, dropout)
        self.ffn_v = FeedForward(d, d_hidden, dropout)

    def forward(self, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        nu, nv = self.norm_u(u), self.norm_v(v)  # both updates read the streams of layer t-1
        u = u + self.attn_u(nu, nv, nv, need_weights=False)[0]
        v = v + self.attn_v(nv, nu, nu, need_weights=False)[0]
        return u + self.ffn_u(self.norm_ffn_u(u)), v + self.ffn_v(self.norm_ffn_v(v))


class BidirectionalCrossAttention(RecordedNet):
    """Standard bi-directional cross-attention transformer (App. I.4; Table 1 row 5).

    ``U_0 = Phi_I(I) + P_I``, ``V_0 = Phi_A(A) + P_A`` (no modality embeddings, no CLS: the streams are separate
    and the head reads mean-pooled tokens), ``T`` layers of :class:`BiLayer`, ``h = [mean U_T; mean V_T]``.
    """

    method = "bi_cross_attention"

    def __init__(
        self,
        d: int = 16,
        depth: int = 10,
        heads: int = 4,
        d_hidden: int = 32,
        dropout: float = 0.1,
        conv_width: int = 16,
    ):
        super().__init__()
        _check_sizes(d, depth, heads, d_hidden, conv_width, dropout)
        self.d, self.depth = d, depth
        self.tokens = _Tokens(d, conv_width, modality_embeddings=False)
        self.layers = nn.ModuleList(BiLayer(d, heads, d_hidden, dropout) for _ in range(depth))
        self.head = _head(2 * d, d_hidden, dropout)

    def represent(self, image: Tensor, audio: Tensor) -> Tensor:
        """``h = concat(mean_j U_T[j], mean_j V_T[j])``, ``(B, 2d)``."""
        u, v = self.tokens(image, audio)
        for layer in self.layers:
            u, v = layer(u, v)
        return torch.cat([u.mean(1), v.mean(1)], dim=-1)

    def forward(self, image: Tensor, audio: Tensor) -> Tensor:
        """Logits ``(B, 10)``."""
        return self.head(self.represent(image, audio))


__all__ = [
    "BidirectionalCrossAttention",
    "ConvTokenizer",
    "MultimodalCrossAttention",
]

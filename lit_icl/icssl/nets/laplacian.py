"""TF^L, the Laplacian module of IC-SSL (Sec. 3.1, App. A.1, Lemma 1): RBF-attention layers
(:class:`RBFAttentionLayer`) whose Laplacian block converges to the episode's graph Laplacian
(:class:`LaplacianTransformer`), and the distance helpers the other nets share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import contiguous_grad
from lit_icl.core.precision import float32_region
from lit_icl.core.validation import (
    check_bool,
    check_int,
    check_literal,
    check_nonempty,
    check_nonnegative,
    check_range,
)

#: Options with fixed choices, typed once: ``--help`` lists them and ``check_literal`` reads them from here.
Activation = Literal["rbf", "linear"]
LaplacianOutput = Literal["random_walk", "laplacian"]


def _centred_gram(x: Tensor) -> Tensor:
    """The Gram matrix ``x_i . x_j`` of the points centred on their mean, ``(..., n, n)``.

    Centred first, as in :func:`~lit_icl.core.spectral.pairwise_sq_dists`: distances from the Gram matrix cancel
    catastrophically far from the origin (App. D translates by up to 1 and scales by 0.02). The mean stays in the
    graph: its gradient is zero in exact arithmetic (distances are translation invariant), but in float32 it
    removes the round-off of the points' gradient along the translation, which the points' offset would
    otherwise amplify in the gradients of the coordinate update (measured: 30x on ``skip_coord``).
    """
    x = x - x.mean(dim=-2, keepdim=True)
    return x @ x.mT


def _sq_dists(x: Tensor) -> Tensor:
    """``||x_i - x_j||^2``, ``(..., n, n)``, as :func:`~lit_icl.core.spectral.pairwise_sq_dists` in fewer kernels.

    The squared norms are the centred Gram matrix's diagonal (a view, and ``d_ii = 0`` exactly); ``relu`` is its
    clamp at 0 (round-off), with a one-kernel backward.
    """
    gram = _centred_gram(x)
    sq = gram.diagonal(dim1=-2, dim2=-1)
    return torch.relu(torch.add(sq.unsqueeze(-1) + sq.unsqueeze(-2), gram, alpha=-2.0))


def _key_distances(x: Tensor) -> Tensor:
    """``E_ji = x_j . x_i - ||x_i||^2 / 2`` of the centred points, ``(..., n, n)``, query ``j`` by key ``i``.

    ``-2 E_ji = ||x_i - x_j||^2 - ||x_j||^2``: the squared distance less a term of the query alone, which a softmax
    over the keys cancels (Eq. 9), so ``softmax_i(-||x_i - x_j||^2 / s^2) = softmax_i(2 E_ji / s^2)`` exactly.
    Dropping it (and the clamp of a distance at 0) saves kernels in a step that a GPU spends launching them.
    """
    gram = _centred_gram(x)
    # The squared norms are the Gram matrix's diagonal (a view, no kernel).
    return torch.add(gram, gram.diagonal(dim1=-2, dim2=-1).unsqueeze(-2), alpha=-0.5)


# --------------------------------------------------------------------------------------------------------
# TF^L: the Laplacian module (Sec. 3.1, App. A.1, Lemma 1)
# --------------------------------------------------------------------------------------------------------
class RBFAttentionLayer(nn.Module):
    """One layer of Eq. (10) with RBF attention (Eq. 9) and the block-diagonal weights of Eq. (11).

    The token state is ``z_i = [x_i ; psi_i]`` with coordinates ``x_i in R^d`` and a Laplacian block
    ``psi_i in R^n``. Following Remark 1 every block of ``W^V, W^Q, W^K, W^S`` is a learnable scalar
    multiple of the identity. We tie the query and key scales of each block (``b = c = 1/sigma`` on
    coordinates, ``b' = c' = 1/rho`` on the Laplacian block), which is the choice of Lemma 1 and makes the
    attention depend on differences only, hence invariant to the random translation of App. D. Per head ``h``:

        kappa^h_ij = softmax_i( -||x_i - x_j||^2 / sigma_h^2 - ||psi_i - psi_j||^2 / rho_h^2 )
        x_j   <- (1 + s)  x_j   + sum_h a_h  sum_i kappa^h_ij x_i
        psi_j <- (1 + s') psi_j + sum_h a'_h sum_i kappa^h_ij psi_i

    The softmax runs over the *key* index ``i``, as in Eq. (9), so ``kappa`` is ``A D^{-1}`` of Eq. (13).
    Several heads with different bandwidths let the layer build a combination of Laplacians (Sec. 3.1).

    ``activation="linear"`` is the ablation of App. F.8 / Table 6 ("linear mapping, no activation"): the
    kernel becomes the unnormalised linear attention
    ``kappa^h_ij = (<x_i, x_j> / sigma_h^2 + <psi_i, psi_j> / rho_h^2) / n`` (no exponential, no softmax).

    Args:
        bandwidths: initial ``sigma_h`` per head (one head per entry).
        exclude_self: set ``A_ii = 0`` (Sec. 3.1); Lemma 1's Eq. (12) keeps the diagonal.
        value_init: initial ``a'_h`` (Lemma 1 uses ``-1`` with one head); ``a_h`` and ``s, s'`` start at 0.
        activation: ``"rbf"`` (Eq. 9) or ``"linear"`` (the Table 6 ablation).
    """

    def __init__(
        self,
        bandwidths: Sequence[float],
        exclude_self: bool = True,
        value_init: float = -1.0,
        update_coordinates: bool = True,
        activation: Activation = "rbf",
    ):
        super().__init__()
        heads = len(check_nonempty("bandwidths", bandwidths, example="[0.01, 0.06]"))
        self.activation = check_literal("activation", activation, Activation)
        if any(not isinstance(b, (int, float)) or isinstance(b, bool) or not b > 0 for b in bandwidths):
            raise ConfigError(f"bandwidths must be a non-empty list of positive numbers, got {list(bandwidths)}")
        check_range("value_init", value_init)
        self.exclude_self = exclude_self
        self.log_sigma = nn.Parameter(torch.tensor([math.log(b) for b in bandwidths]))
        # rho = exp(log_rho); the Laplacian block starts almost switched off (rho = 10 on unit-scale rows).
        self.log_rho = nn.Parameter(torch.full((heads,), math.log(10.0)))
        self.value_lap = nn.Parameter(torch.full((heads,), value_init / heads))  # a'_h
        self.skip_lap = nn.Parameter(torch.zeros(()))  # s'
        # The coordinate block's update (a_h, s) only matters if a later layer reads the coordinates; the last
        # layer has none, so DDP sees no unused parameters.
        self.update_coordinates = update_coordinates
        if update_coordinates:
            self.value_coord = nn.Parameter(torch.zeros(heads))  # a_h
            self.skip_coord = nn.Parameter(torch.zeros(()))  # s

    def attention(self, x: Tensor, psi: Tensor) -> Tensor:
        """Per-head attention weights ``W[b, h, j, i] = kappa^h_ij`` (row ``j`` sums to 1 over ``i`` for RBF).

        All heads at once: the exponent (or the linear kernel) of head ``h`` is ``c_h^x K^x + c_h^psi K^psi`` with
        one ``n x n`` matrix per block, so it is one ``(H, 2) x (2, n^2)`` product whatever the number of heads.
        """
        b, n = x.shape[0], x.shape[-2]
        # (2, H): 1/sigma_h^2 and 1/rho_h^2 (Remark 1's tied query/key scales b = c = 1/sigma, b' = c' = 1/rho)
        coef = torch.exp(-2.0 * contiguous_grad(torch.stack((self.log_sigma, self.log_rho))))  # used transposed
        if self.activation == "linear":
            # Table 6: kappa_ij = (<x_i, x_j> / sigma^2 + <psi_i, psi_j> / rho^2) / n, no softmax.
            coef = coef / n
            blocks = (x @ x.mT, psi @ psi.mT)
        else:
            # Eq. (9): softmax_i(-||x_i - x_j||^2 / sigma^2 - ||psi_i - psi_j||^2 / rho^2) with the query-only
            # terms dropped (see _key_distances): the exponent is 2 E^x / sigma^2 + 2 E^psi / rho^2.
            coef = 2.0 * coef
            blocks = (_key_distances(x), _key_distances(psi))
        # The first layer's psi is the batch-free M of App. A.1: broadcast its block to the batch.
        blocks = torch.stack([blk.expand(b, n, n) for blk in blocks], dim=1)  # (B, 2, n, n)
        scores = torch.bmm(coef.mT.expand(b, -1, -1), blocks.view(b, 2, n * n)).view(b, -1, n, n)
        if self.activation == "linear":
            if self.exclude_self:
                scores = scores.masked_fill(torch.eye(n, dtype=torch.bool, device=x.device), 0.0)
            return scores
        if self.exclude_self:
            scores = scores.masked_fill(torch.eye(n, dtype=torch.bool, device=x.device), float("-inf"))
        return torch.softmax(scores, dim=-1)

    @float32_region
    def forward(self, x: Tensor, psi: Tensor) -> tuple[Tensor, Tensor]:
        # float32 (bf16 inputs are upcast; autocast is off here), or float64 after net.double().
        x, psi = x.to(self.log_sigma.dtype), psi.to(self.log_sigma.dtype)
        w = self.attention(x, psi)
        b, heads, n, _ = w.shape
        # Mix heads first, both blocks in one product: row c of (V, H) @ (H, n^2) is sum_h a^c_h W_h, one (n x n)
        # matrix per block, so each value product is done once (Eq. 10: sum_h Attn(Z; W^V_h, ...)).
        if self.update_coordinates:
            values = torch.stack((self.value_lap, self.value_coord))
        else:
            values = self.value_lap.unsqueeze(0)
        mixed = torch.bmm(values.expand(b, -1, -1), w.view(b, heads, n * n))
        w_lap, *w_coord = mixed.view(b, -1, n, n).unbind(1)
        # (1 + s') psi + W_lap psi; the first layer's psi is the batch-free M of App. A.1.
        psi = torch.baddbmm((1.0 + self.skip_lap) * psi, w_lap, psi.expand(b, n, psi.shape[-1]))
        if self.update_coordinates:
            x = torch.baddbmm((1.0 + self.skip_coord) * x, w_coord[0], x)
        return x, psi


class LaplacianTransformer(nn.Module):
    """``TF^L`` of Sec. 3.1: RBF-attention layers whose Laplacian block converges to ``I - A D^{-1}``.

    The input is ``Z_0^T = [X^T, M]`` (App. A.1) with a learnable initialisation ``M in R^{n x n}``, started
    at the identity as in Lemma 1. The output Laplacian block ``Psi`` (token ``j`` holds column ``j`` of the
    paper's ``L_hat``, i.e. ``Psi = L_hat^T``) feeds the eigenmap module.

    Args:
        n_points: episode size ``n``; fixed, because ``M`` is ``n x n`` (a limitation the reviewers noted).
        num_layers: RBF-attention layers.
        bandwidths: initial RBF bandwidths ``sigma_h``, one head each; the default spans the range of point
            spacings produced by the random scale of App. D (0.02 to 0.1).
        exclude_self: drop self loops, ``A_ii = 0`` (Sec. 3.1).
        output: what the first layer is initialised to produce: ``"laplacian"``, ``L_hat = I - A D^{-1}``
            (Lemma 1: ``a' = -1, s' = 0``), or ``"random_walk"``, ``A D^{-1} = I - L_hat`` (``a' = 1, s' = -1``).
            Both are points of the same parameter family; the second lets the eigenmap module start as plain
            subspace iteration (see :class:`EigenmapTransformer`), which trains much better from scratch.
        activation: ``"rbf"`` (Eq. 9) or ``"linear"`` (Table 6's ablation, see :class:`RBFAttentionLayer`).
        learn_init: learn ``M`` (default). ``False`` fixes ``M = I``: the parameter count then does not grow with
            ``n`` (Remark 1) and the module is permutation-equivariant (a learned ``M`` ties ``n^2`` parameters
            to token positions: 10,000 of the default model's 11,433).
    """

    def __init__(
        self,
        n_points: int = 100,
        num_layers: int = 2,
        bandwidths: Sequence[float] = (0.004, 0.01, 0.025, 0.06),
        exclude_self: bool = True,
        output: LaplacianOutput = "random_walk",
        init_lr_scale: float = 0.01,
        activation: Activation = "rbf",
        learn_init: bool = True,
    ):
        super().__init__()
        check_int("n_points", n_points, minimum=2, hint="an episode needs at least 2 points")
        check_int("num_layers", num_layers, minimum=1, hint="the Laplacian module needs at least one layer")
        check_literal("output", output, LaplacianOutput)
        check_nonnegative("init_lr_scale", init_lr_scale)
        self.n_points = n_points
        # M of App. A.1, started at I (Lemma 1) and stored as M = I + init_lr_scale * delta. Adam moves every
        # entry of a parameter by about lr per step whatever its gradient, so a raw n x n M is scrambled
        # (100^2 entries of noise) long before a useful gradient reaches it; the scale keeps M near I.
        check_bool("learn_init", learn_init)
        self.register_buffer("init_base", torch.eye(n_points))
        if learn_init:
            self.init_delta = nn.Parameter(torch.zeros(n_points, n_points))
        else:
            self.register_buffer("init_delta", torch.zeros(n_points, n_points))
        self.init_lr_scale = init_lr_scale
        # Later layers start as identity maps (a' = 0) so training begins from the Lemma-1 Laplacian.
        self.layers = nn.ModuleList(
            RBFAttentionLayer(
                bandwidths, exclude_self, value_init=0.0, update_coordinates=i < num_layers - 1, activation=activation
            )
            for i in range(num_layers)
        )
        first = self.layers[0]
        with torch.no_grad():
            first.value_lap.fill_((1.0 if output == "random_walk" else -1.0) / len(bandwidths))
            first.skip_lap.fill_(-1.0 if output == "random_walk" else 0.0)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x: (B, n, d)`` -> ``(x_out (B, n, d), Psi (B, n, n))``."""
        _b, n, _ = x.shape
        if n != self.n_points:
            raise ConfigError(
                f"the Laplacian module was built for n_points={self.n_points} but got episodes of {n} points; "
                f"set the net's n_points to the data's n_points"
            )
        # Not expanded to the batch: the first layer broadcasts it, saving an (n x n) copy per episode.
        psi = self.init_state.unsqueeze(0)
        for layer in self.layers:
            x, psi = layer(x, psi)
        return x, psi

    @property
    def init_state(self) -> Tensor:
        """The learnable initialisation ``M in R^{n x n}`` of App. A.1 (``I + scale * delta``, one kernel)."""
        return torch.add(self.init_base, self.init_delta, alpha=self.init_lr_scale)

    @classmethod
    def from_lemma1(cls, n_points: int, sigma: float, exclude_self: bool = False) -> LaplacianTransformer:
        """The single-head, single-layer construction of Lemma 1, whose output block is ``I - A D^{-1}``.

        ``M = I``, ``a = 0``, ``a' = -1``, ``b = c = 1/sigma``, ``b' = c' = 0``, ``s = s' = 0``.
        """
        net = cls(n_points, num_layers=1, bandwidths=[sigma], exclude_self=exclude_self, output="laplacian")
        layer = net.layers[0]
        with torch.no_grad():
            layer.skip_lap.zero_()
            layer.log_rho.fill_(float("inf"))  # b' = c' = 0: the Laplacian block does not enter the kernel
            layer.value_lap.fill_(-1.0)  # a' = -1; the single (last) layer has a = s = 0 by construction
        return net

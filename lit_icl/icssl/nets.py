"""Networks of IC-SSL (in-context semi-supervised learning): plain ``nn.Module``s, no Lightning.

Every model of Sec. 4.1 is written ``[Data + Model]``: a *representation* ``phi(X)`` computed from all ``n``
points of an episode, followed by a *classifier* that sees the ``m`` labels. Here that is literally
:class:`SemiSupervisedICL` ``(representation, head)``:

=================  =================================  =========================
paper name         representation                     head
=================  =================================  =========================
ORIG+E2E-ICL       :class:`InContextEigenmap`         :class:`GDICLHead`
EIG+ICL            :class:`LaplacianEigenmap`         :class:`GDICLHead`
ORIG+ICL           :class:`RawCoordinates`            :class:`GDICLHead`
=================  =================================  =========================

Layouts are token-major: a batch of episodes is ``(B, n, features)`` and token ``i`` is row ``i``. The paper
writes tokens as *columns* (``Z in R^{(d+n) x n}``), so a paper matrix ``Z`` is our ``Z^T`` per episode.

The representation modules compute distances, Gram matrices and a power iteration; they run in float32 with
autocast disabled, as those lose their meaning in bf16. Only the head's MLP follows autocast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from lit_icl.core.errors import ConfigError
from lit_icl.core.precision import float32_region
from lit_icl.core.spectral import LaplacianNorm, laplacian_eigenmap
from lit_icl.core.validation import (
    check_int,
    check_literal,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_range,
)

#: Options with fixed choices, typed once: ``--help`` lists them and ``check_literal`` reads them from here.
Activation = Literal["rbf", "linear"]
LaplacianOutput = Literal["random_walk", "laplacian"]
EigenmapInit = Literal["subspace", "lemma2"]
Kernel = Literal["rbf", "linear"]
Expectation = Literal["mlp", "exact"]

#: The floor of a column norm in the paper's ``normalize`` of Eq. (15).
_NORM_EPS = 1e-8


def _normalize_columns(phi: Tensor, eps: float = _NORM_EPS) -> Tensor:
    """Unit-norm columns over the tokens: the paper's row-wise ``normalize`` of Eq. (15) in our layout."""
    return phi / phi.norm(dim=-2, keepdim=True).clamp_min(eps)


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
        coef = torch.exp(-2.0 * torch.stack((self.log_sigma, self.log_rho)))
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
        if not isinstance(learn_init, bool):
            raise ConfigError(f"learn_init={learn_init!r} must be true or false")
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
        b, n, _ = x.shape
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


# --------------------------------------------------------------------------------------------------------
# TF^phi: the eigenmap module (Sec. 3.1, App. A.2, Lemma 2)
# --------------------------------------------------------------------------------------------------------
class EffectiveWeights(NamedTuple):
    """What one application of a :class:`LinearAttentionLayer` needs of its weights (Eq. 16), in our layout.

    With ``P = Phi^T Phi`` one application is ``out = Phi (base + mix(P)) + (G Phi) value_t`` (Eq. 15), where
    ``mix(P) = sum_h C_h^T B_h P A_h^T`` is linear in ``P``: ``vec(mix(P)) = kron vec(P)`` with row-major ``vec``.
    Stacked over layers each field gains a leading layer axis.
    """

    base: Tensor  # (k, k): (I + S)^T
    value_t: Tensor  # (k, k): (sum_h beta_h A_h)^T, the Psi-part of every head
    kron: Tensor  # (k^2, k^2): sum_h (C_h^T B_h) (x) A_h, the Phi-part of every head


def _effective_weights(skip: Tensor, beta: Tensor, value: Tensor, query: Tensor, key: Tensor) -> EffectiveWeights:
    """:class:`EffectiveWeights` from a layer's ``S (k, k)``, ``beta (H,)``, ``A, B, C (H, k, k)`` (Eq. 16), or from
    a stack of layers (a leading layer axis on each), in one pass.

    ``mix(P)[i, m] = sum_{h, j, l} (C_h^T B_h)[i, j] P[j, l] A_h[m, l]``, so the Kronecker matrix's entry at row
    ``(i, m)``, column ``(j, l)`` is ``sum_h (C_h^T B_h)[i, j] A_h[m, l]``: a product over the heads of the
    flattened ``C_h^T B_h`` and ``A_h``, reordered from ``(i, j), (m, l)`` to ``(i, m), (j, l)``.
    """
    k = skip.shape[-1]
    lead = skip.shape[:-2]
    base = torch.eye(k, dtype=skip.dtype, device=skip.device) + skip.mT  # contiguous: reshaped every step
    value_t = (beta.unsqueeze(-2) @ value.flatten(-2)).view(*lead, k, k).mT  # (sum_h beta_h A_h)^T
    cb = key.mT @ query  # C_h^T B_h
    kron = (cb.flatten(-2).mT @ value.flatten(-2)).view(*lead, k, k, k, k)  # [i, j, m, l]
    return EffectiveWeights(base, value_t, kron.transpose(-3, -2).reshape(*lead, k * k, k * k))


class _EigenmapIterations(torch.autograd.Function):
    """Applications of Eq. (15) along a schedule of layers, with a hand-written backward.

    ``forward(phi, gram, base, value_t, kron, repeats)``: ``phi (B, n, k)``, ``gram = Psi^T Psi (B, n, n)`` and a
    layer stack of :class:`EffectiveWeights` (``(L, k, k)``, ``(L, k, k)``, ``(L, k^2, k^2)``); ``repeats =
    (stack_repeats, layer_repeats)`` gives the schedule of Remark 3: the stack of ``L`` layers ``stack_repeats``
    times, each layer ``layer_repeats`` times in a row. Step ``t`` with layer ``l`` computes

        P = Phi^T Phi,  W = base_l + mix_l(P),  out = Phi W + (G Phi) value_t_l,  Phi <- out / max(|out_j|, eps)

    in 8 kernels. The point of the Function is the backward, which a GPU step spends launching kernels. Autograd
    through the same forward takes about 36 kernels a step (577 for the default net's 16 steps), mostly on the
    per-step gradients of the four matrices every step shares (``G`` and a layer's three weights) and on the
    normalisation's three ops; here a step costs 9 kernels, and each shared matrix's gradient is one product over
    all steps at the end (173 in all). With ``d_out`` the gradient of a step's ``out``, the gradients are

        d_out = (g - y <g, y>_j [|out_j| >= eps]) / max(|out_j|, eps)          (y = the step's output, per column j)
        d_Phi = d_out W^T + G^T d_out value_t^T + Phi (dP + dP^T),  vec(dP) = kron^T vec(Phi^T d_out)
        d_G = sum_t (d_out_t value_t^T) Phi_t^T,  d_value_t = sum_{t, b} (G Phi_t)^T d_out_t,
        d_base = sum_{t, b} Phi_t^T d_out_t,  d_kron = sum_{t, b} vec(Phi_t^T d_out_t) vec(P_t)^T

    (the sums over the steps of each layer; ``[.]`` is the clamp's subgradient, as autograd's ``clamp_min``).
    """

    @staticmethod
    def forward(ctx, phi, gram, base, value_t, kron, repeats):  # noqa: ANN001, ANN205
        b, _, k = phi.shape
        stack_repeats, layer_repeats = repeats
        phis, g_phis, ps, ws, norms = [phi], [], [], [], []
        for _ in range(stack_repeats):
            for layer in range(base.shape[0]):
                for _ in range(layer_repeats):
                    p = phi.mT @ phi  # (B, k, k)
                    # W = (I + S)^T + mix(P): one matrix product with kron, the identity and skip folded in
                    w = torch.addmm(base[layer].reshape(k * k), p.reshape(b, k * k), kron[layer].mT).view(b, k, k)
                    g_phi = gram @ phi
                    out = torch.baddbmm(phi @ w, g_phi, value_t[layer].expand(b, k, k))
                    norm = torch.linalg.vector_norm(out, dim=-2, keepdim=True)
                    phi = out / norm.clamp_min(_NORM_EPS)
                    phis.append(phi)
                    g_phis.append(g_phi)
                    ps.append(p)
                    ws.append(w)
                    norms.append(norm)
        ctx.repeats = repeats
        ctx.steps = len(ws)
        ctx.save_for_backward(gram, base, value_t, kron, *phis, *g_phis, *ps, *ws, *norms)
        return phi

    @staticmethod
    @once_differentiable
    @float32_region
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        gram, base, value_t, kron, *saved = ctx.saved_tensors
        steps = ctx.steps
        phis = saved[: steps + 1]  # phis[t] is step t's input, phis[t + 1] its output
        g_phis, ps, ws, norms = (saved[steps + 1 + i * steps : steps + 1 + (i + 1) * steps] for i in range(4))
        stack_repeats, layer_repeats = ctx.repeats
        layers, kk = kron.shape[:2]
        b, n, k = grad.shape

        # The normalisation's per-column factors, for all steps at once: 1 / max(|out|, eps), and that times the
        # clamp's subgradient, folded into the outputs y.
        norm = torch.cat(norms, dim=-1)  # (B, 1, steps k)
        inv = norm.clamp_min(_NORM_EPS).reciprocal()
        phi_all = torch.cat(phis, dim=-1)  # (B, n, (steps + 1) k)
        y_scaled = phi_all[..., k:] * (inv * (norm >= _NORM_EPS))
        # P is symmetric, so its gradient enters as dP + dP^T: fold the transpose into kron once.
        kron4 = kron.view(layers, kk, k, k)
        kron_sym = (kron4 + kron4.mT).view(layers, kk, kk)

        d_outs, d_ws, d_gphis = [], [], []
        g = grad
        schedule = [layer for _ in range(stack_repeats) for layer in range(layers) for _ in range(layer_repeats)]
        for t in reversed(range(steps)):
            layer, cols = schedule[t], slice(t * k, (t + 1) * k)
            y = phi_all[..., k + t * k : k + (t + 1) * k]
            dots = (g.mT @ y).diagonal(dim1=-2, dim2=-1).unsqueeze(-2)  # <g_j, y_j> per column j, (B, 1, k)
            d_out = torch.addcmul(g * inv[..., cols], y_scaled[..., cols], dots, value=-1.0)
            phi = phis[t]
            d_w = phi.mT @ d_out
            d_gphi = d_out @ value_t[layer].mT
            d_outs.append(d_out)
            d_ws.append(d_w)
            d_gphis.append(d_gphi)
            if t > 0 or ctx.needs_input_grad[0]:
                d_p = (d_w.reshape(b, kk) @ kron_sym[layer]).view(b, k, k)  # dP + dP^T
                g = torch.baddbmm(d_out @ ws[t].mT, gram.mT, d_gphi)
                g = torch.baddbmm(g, phi, d_p)
        d_outs.reverse()
        d_ws.reverse()
        d_gphis.reverse()

        def per_layer(per_step: Tensor) -> Tensor:
            """Sum a (steps, ...) tensor over the steps of each layer -> (L, ...)."""
            return per_step.view(stack_repeats, layers, layer_repeats, *per_step.shape[1:]).sum((0, 2))

        d_phi = g if ctx.needs_input_grad[0] else None
        d_gram = d_base = d_value_t = d_kron = None
        if ctx.needs_input_grad[1]:
            d_gram = torch.cat(d_gphis, dim=-1) @ phi_all[..., :-k].mT
        if ctx.needs_input_grad[2] or ctx.needs_input_grad[4]:
            d_w_all = torch.stack(d_ws)  # (steps, B, k, k)
            if ctx.needs_input_grad[2]:
                d_base = per_layer(d_w_all.sum(1))
            if ctx.needs_input_grad[4]:
                d_kron = per_layer(d_w_all.view(steps, b, kk).mT @ torch.stack(ps).view(steps, b, kk))
        if ctx.needs_input_grad[3]:
            g_phi_all = torch.stack(g_phis).view(steps, b * n, k)
            d_value_t = per_layer(g_phi_all.mT @ torch.stack(d_outs).view(steps, b * n, k))
        return d_phi, d_gram, d_base, d_value_t, d_kron, None


class LinearAttentionLayer(nn.Module):
    """One layer of Eq. (15) with linear attention and the block weights of Eq. (16).

    Token ``i`` carries ``[psi_i ; phi_i]`` with ``psi_i in R^n`` (the Laplacian block, read-only: we fix
    ``a = s = 0`` on it, as every construction of Lemma 2 does) and the eigenmap ``phi_i in R^k``. With
    ``G = Psi^T Psi`` (``G_ij = psi_i . psi_j``) and per-head ``k x k`` matrices ``A_h, B_h, C_h`` and scalar
    ``beta_h = b_h c_h``, the attention score is ``S^h_ij = beta_h psi_i.psi_j + phi_i^T B_h^T C_h phi_j`` and

        Phi <- Phi (I + S)^T + sum_h [ beta_h G Phi A_h^T + Phi C_h^T B_h (Phi^T Phi) A_h^T ]

    followed by unit-norm columns (the paper's row normalisation). Both products are computed without forming
    an ``n x n`` score matrix per head: the heads are summed into the three matrices of :class:`EffectiveWeights`
    (:meth:`effective_weights`), which :class:`EigenmapTransformer` computes once per forward for all the
    applications of the layer.
    """

    def __init__(self, n_components: int, num_heads: int):
        super().__init__()
        k = check_int("n_components", n_components, minimum=1)
        h = check_int("num_heads", num_heads, minimum=1)
        self.skip = nn.Parameter(torch.zeros(k, k))  # S
        self.beta = nn.Parameter(torch.zeros(h))  # b c per head
        self.value = nn.Parameter(torch.zeros(h, k, k))  # A
        self.query = nn.Parameter(torch.zeros(h, k, k))  # B
        self.key = nn.Parameter(torch.zeros(h, k, k))  # C

    def effective_weights(self) -> EffectiveWeights:
        """This layer's heads summed into the three matrices of :class:`EffectiveWeights` (Eq. 16)."""
        return _effective_weights(self.skip, self.beta, self.value, self.query, self.key)

    @float32_region
    def forward(self, phi: Tensor, gram: Tensor) -> Tensor:
        """One application, ``phi (B, n, k)``, ``gram = Psi^T Psi (B, n, n)``."""
        dtype = self.skip.dtype  # float32 (autocast is off here), or float64 after net.double()
        weights = [w.unsqueeze(0) for w in self.effective_weights()]
        return _EigenmapIterations.apply(phi.to(dtype), gram.to(dtype), *weights, (1, 1))


class EigenmapTransformer(nn.Module):
    """``TF^phi`` of Sec. 3.1: linear attention implementing block power iteration (Lemma 2).

    The input is the Laplacian block ``Psi`` from :class:`LaplacianTransformer`; the eigenmap block starts at a
    learnable initial guess ``M in R^{n x k}`` (App. A.2). As in Remark 3 each layer is applied
    ``layer_repeats`` times and the whole stack ``stack_repeats`` times with tied weights.

    Initialisation (training then moves freely in the parameter family of Eq. 16): even layers do a power
    step ``Phi <- G Phi`` (head 0: ``beta = 1``, ``A = I``, ``S = -I``), odd layers orthogonalise column ``i``
    against columns ``j < i`` with head ``i`` (the Gram-Schmidt construction of the Lemma 2 proof, with the
    ``H`` heads working on ``H`` columns at once, Remark 3.2). With the random-walk block ``Psi = A D^{-1}``
    this is subspace iteration towards the top eigenvectors of ``G = Psi^T Psi``, the smooth, low-frequency
    functions on the point cloud, i.e. the bottom of the Laplacian spectrum. Lemma 2's own shifted form
    (power step on ``mu I - G`` with ``Psi = L_hat``) is :meth:`from_lemma2`; it needs thousands of steps
    because the bottom of ``L_hat^T L_hat`` is tightly clustered, which is why it is not the training default.
    ``init="lemma2"`` starts from that construction inside a trainable net (``num_layers = n_components``,
    ``num_heads = 1``).

    ``learn_init=False`` replaces the learned ``M`` (``n k`` parameters, each tied to a token *position*)
    by a guess computed from each episode's own coordinates, ``[1, x_1, ..., x_d, x_1^2, ...]`` (first ``k``
    columns): no parameter grows with ``n`` (Remark 1) and the module is permutation-equivariant. Low-order
    polynomials of the coordinates are smooth on the point cloud, so they overlap the bottom eigenvectors
    that the iteration extracts.
    """

    def __init__(
        self,
        n_points: int = 100,
        n_components: int = 4,
        num_layers: int = 2,
        num_heads: int | None = None,
        layer_repeats: int = 2,
        stack_repeats: int = 4,
        init_lr_scale: float = 0.01,
        init: EigenmapInit = "subspace",
        mu: float = 4.0,
        learn_init: bool = True,
    ):
        super().__init__()
        num_heads = self._validate(n_points, n_components, num_layers, num_heads, layer_repeats, stack_repeats,
                                   init_lr_scale, init, mu, learn_init)
        self.n_points = n_points
        self.n_components = n_components
        self.layer_repeats = layer_repeats
        self.stack_repeats = stack_repeats
        init_guess = torch.empty(n_points, n_components)
        nn.init.orthogonal_(init_guess)
        # M of App. A.2, reparametrised like the Laplacian module's M (see there).
        self.learn_init = learn_init
        if learn_init:
            self.register_buffer("init_base", init_guess)
            self.init_delta = nn.Parameter(torch.zeros(n_points, n_components))
        self.init_lr_scale = init_lr_scale
        self.layers = nn.ModuleList(LinearAttentionLayer(n_components, num_heads) for _ in range(num_layers))
        if init == "lemma2":
            self._init_lemma2(mu)
        else:
            self._init_subspace(num_heads)

    @staticmethod
    def _validate(
        n_points: int,
        n_components: int,
        num_layers: int,
        num_heads: int | None,
        layer_repeats: int,
        stack_repeats: int,
        init_lr_scale: float,
        init: str,
        mu: float,
        learn_init: bool,
    ) -> int:
        """The constructor's argument checks; returns the number of heads (default: one per component, 1 for
        ``init="lemma2"``)."""
        check_literal("init", init, EigenmapInit)
        check_positive("mu", mu, hint="the shift of Lemma 2's power step; it must exceed the top of G")
        if not isinstance(learn_init, bool):
            raise ConfigError(f"learn_init={learn_init!r} must be true or false")
        if init == "lemma2":
            if num_heads is None:
                num_heads = 1
            if num_heads != 1 or num_layers != n_components:
                raise ConfigError(
                    f"init='lemma2' is Lemma 2's construction: it needs num_layers = n_components = {n_components} "
                    f"and num_heads = 1 (got {num_layers} and {num_heads})"
                )
        num_heads = n_components if num_heads is None else num_heads
        check_int("n_points", n_points, minimum=2, hint="an episode needs at least 2 points")
        check_int("n_components", n_components)
        if not 1 <= n_components < n_points:
            raise ConfigError(f"n_components={n_components} must lie in [1, n_points - 1 = {n_points - 1}]")
        for name, value in (("num_layers", num_layers), ("num_heads", num_heads),
                            ("layer_repeats", layer_repeats), ("stack_repeats", stack_repeats)):
            check_int(name, value, minimum=1)
        check_nonnegative("init_lr_scale", init_lr_scale)
        return num_heads

    def _init_subspace(self, num_heads: int) -> None:
        """Alternating power steps and Gram-Schmidt heads (see the class docstring)."""
        num_layers, k, eye = len(self.layers), self.n_components, torch.eye(self.n_components)
        with torch.no_grad():
            for idx, layer in enumerate(self.layers):
                # Tiny random weights everywhere keep unused heads trainable (all-zero heads get no gradient).
                for p in (layer.query, layer.key, layer.value):
                    p.normal_(0.0, 1e-3)
                if idx % 2 == 0 or num_layers == 1:
                    layer.beta[0] = 1.0
                    layer.value[0] = eye
                    layer.skip.copy_(-eye)
                if idx % 2 == 1 or num_layers == 1:
                    for i in range(1, min(num_heads, k)):
                        mask = torch.diag((torch.arange(k) < i).float())
                        layer.query[i] = mask
                        layer.key[i] = mask
                        layer.value[i].zero_()
                        layer.value[i, i, i] = -1.0

    @property
    def init_state(self) -> Tensor:
        """The learnable initial guess ``M in R^{n x k}`` of App. A.2 (``base + scale * delta``, one kernel)."""
        return torch.add(self.init_base, self.init_delta, alpha=self.init_lr_scale)

    def coordinate_guess(self, x: Tensor) -> Tensor:
        """The position-free initial guess ``[1, x - mean, (x - mean)^2]`` (first ``k`` columns), ``(B, n, k)``."""
        x = x.to(self.layers[0].skip.dtype)
        centred = x - x.mean(-2, keepdim=True)
        cols = torch.cat([torch.ones_like(centred[..., :1]), centred, centred * centred], dim=-1)
        if cols.shape[-1] < self.n_components:
            raise ConfigError(
                f"learn_init=False builds the initial guess from 1 + 2d = {cols.shape[-1]} coordinate functions, "
                f"fewer than n_components={self.n_components}; use learn_init=True or fewer components"
            )
        return cols[..., : self.n_components]

    @float32_region
    def forward(self, psi: Tensor, x: Tensor | None = None) -> Tensor:
        """``psi: (B, n, n)`` token-major Laplacian block -> eigenmap ``(B, n, k)`` with unit-norm columns.

        ``x`` (the episode's coordinates) is needed only with ``learn_init=False``.
        """
        psi = psi.to(self.layers[0].skip.dtype)  # float32, or float64 after net.double()
        gram = psi @ psi.mT  # paper's Psi^T Psi
        if self.learn_init:
            phi = _normalize_columns(self.init_state).unsqueeze(0).expand(psi.shape[0], -1, -1)
        else:
            if x is None:
                raise ValueError("EigenmapTransformer(learn_init=False) needs the coordinates x in forward")
            phi = _normalize_columns(self.coordinate_guess(x))
        # Every application of a layer uses the same weights: sum the heads of all layers once per forward (one
        # pass over the stacked parameters), not once per application.
        stacked = (torch.stack([getattr(layer, name) for layer in self.layers])
                   for name in ("skip", "beta", "value", "query", "key"))
        weights = _effective_weights(*stacked)
        return _EigenmapIterations.apply(phi, gram, *weights, (self.stack_repeats, self.layer_repeats))

    @classmethod
    def from_lemma2(cls, n_points: int, n_components: int, mu: float, iterations: int) -> EigenmapTransformer:
        """The construction in the proof of Lemma 2: ``iterations`` steps of block power iteration with QR.

        Layer 0 does the power step ``Phi <- (mu I - G) Phi`` (``beta = 1``, ``A = -I``, ``S = (mu-1) I``);
        layer ``i = 1..k-1`` orthogonalises column ``i`` against columns ``j < i`` (``A = -e_i e_i^T``,
        ``B = C = diag(1[j < i])``, ``beta = 0``); unit-norm columns after every layer complete the QR step.
        The columns converge to the bottom eigenvectors of ``G = Psi^T Psi`` when ``mu I > G``.
        """
        k = n_components
        return cls(
            n_points, k, num_layers=k, num_heads=1, layer_repeats=1, stack_repeats=iterations, init="lemma2", mu=mu
        )

    def _init_lemma2(self, mu: float) -> None:
        """The weights of :meth:`from_lemma2`'s construction."""
        k = self.n_components
        eye = torch.eye(k)
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                layer.query.zero_()
                layer.key.zero_()
                layer.value.zero_()
                layer.beta.zero_()
                layer.skip.zero_()
                if i == 0:
                    layer.beta.fill_(1.0)
                    layer.value[0] = -eye
                    layer.skip.copy_((mu - 1.0) * eye)
                else:
                    mask = torch.diag((torch.arange(k) < i).float())
                    layer.query[0] = mask
                    layer.key[0] = mask
                    layer.value[0, i, i] = -1.0


# --------------------------------------------------------------------------------------------------------
# Representations phi(X)
# --------------------------------------------------------------------------------------------------------
class InContextEigenmap(nn.Module):
    """``TF_rep = TF^phi o TF^L`` (Sec. 3.1): the learned, in-context Laplacian eigenmap of ORIG+E2E-ICL.

    The two ablations of Table 6 (App. F.8) are options: ``lap_activation="linear"`` (the Laplacian module
    without the RBF activation) and ``lap_layers = eig_layers = layer_repeats = stack_repeats = 1`` (the
    non-iterative "1-layer Lap+PE", one pass through each module).

    The paper-faithful form (``configs/icssl/manifolds/faithful.yaml``) is ``lap_output="laplacian"`` (TF^L
    outputs ``L_hat``, Lemma 1), ``eig_init="lemma2"`` (TF^phi starts as Lemma 2's shifted power iteration,
    ``eig_layers = n_components``, one head), ``layer_repeats = stack_repeats = 2`` (Remark 3's looping) and
    ``learn_init=False`` (fixed ``M``, Remark 1).
    """

    def __init__(
        self,
        n_points: int = 100,
        n_components: int = 4,
        lap_layers: int = 2,
        lap_bandwidths: Sequence[float] = (0.004, 0.01, 0.025, 0.06),
        exclude_self: bool = True,
        lap_output: LaplacianOutput = "random_walk",
        eig_layers: int = 2,
        eig_heads: int | None = None,
        layer_repeats: int = 2,
        stack_repeats: int = 4,
        lap_activation: Activation = "rbf",
        learn_init: bool = True,
        eig_init: EigenmapInit = "subspace",
        eig_mu: float = 4.0,
    ):
        super().__init__()
        check_literal("lap_activation", lap_activation, Activation)
        # Checked here under this class's own option names (the parts below call them num_layers, ...).
        check_int("n_points", n_points, minimum=2, hint="an episode needs at least 2 points")
        check_int("n_components", n_components)
        if not 1 <= n_components < n_points:
            raise ConfigError(f"n_components={n_components} must lie in [1, n_points - 1 = {n_points - 1}]")
        check_int("lap_layers", lap_layers, minimum=1)
        check_int("eig_layers", eig_layers, minimum=1)
        if eig_heads is not None:
            check_int("eig_heads", eig_heads, minimum=1, hint="or leave it unset for one head per component")
        check_int("layer_repeats", layer_repeats, minimum=1)
        check_int("stack_repeats", stack_repeats, minimum=1)
        self.n_points = n_points
        self.out_dim = n_components
        self.laplacian = LaplacianTransformer(
            n_points, lap_layers, lap_bandwidths, exclude_self, lap_output, activation=lap_activation,
            learn_init=learn_init,
        )
        self.eigenmap = EigenmapTransformer(
            n_points, n_components, eig_layers, eig_heads, layer_repeats, stack_repeats,
            init=eig_init, mu=eig_mu, learn_init=learn_init,
        )

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the episode size the data produces must be the one ``M`` was built for."""
        data_n = getattr(datamodule, "n_points", None)
        if data_n is not None and data_n != self.n_points:
            raise ConfigError(
                f"the representation was built for n_points={self.n_points} but the data has n_points={data_n}; "
                f"set the representation's n_points to {data_n}"
            )

    def forward(self, x: Tensor) -> Tensor:
        _, psi = self.laplacian(x)
        return self.eigenmap(psi, x)


class LaplacianEigenmap(nn.Module):
    """EIG of Sec. 4.1: exact bottom eigenvectors of the kNN-RBF graph Laplacian (App. D), no parameters."""

    def __init__(
        self,
        n_components: int = 4,
        n_neighbors: int = 6,
        rbf_scale: float = 10.0,
        normalization: LaplacianNorm = "sym",
    ):
        super().__init__()
        check_int("n_components", n_components, minimum=1)
        check_int("n_neighbors", n_neighbors, minimum=1)
        check_positive("rbf_scale", rbf_scale, hint="App. D uses 10")
        check_literal("normalization", normalization, LaplacianNorm)
        self.out_dim = n_components
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.rbf_scale = rbf_scale
        self.normalization = normalization

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the kNN graph and the eigenvectors must fit in the data's episodes."""
        n = getattr(datamodule, "n_points", None)
        if n is None:
            return
        if self.n_neighbors > n - 1:
            raise ConfigError(
                f"n_neighbors={self.n_neighbors} but episodes have only {n} points; "
                f"choose 1 <= n_neighbors <= {n - 1}"
            )
        if self.n_components > n:
            raise ConfigError(
                f"n_components={self.n_components} must lie in [1, {n}] for episodes of {n} points"
            )

    def forward(self, x: Tensor) -> Tensor:
        return laplacian_eigenmap(x, self.n_components, self.n_neighbors, self.rbf_scale, self.normalization)


class RawCoordinates(nn.Module):
    """ORIG of Sec. 4.1: the raw coordinates, unchanged (the control without representation learning)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.float()


def check_input_dim(net: nn.Module, datamodule: object, option: str) -> None:
    """Refuse a net whose ``input_dim`` is not the data's point dimension (``datamodule.ambient_dim``), naming
    the ``option`` that sets it; data that does not say its dimension passes."""
    dim = getattr(datamodule, "ambient_dim", None)
    if dim is not None and dim != net.input_dim:
        raise ConfigError(
            f"{type(net).__name__} input_dim={net.input_dim} but the data's points have {dim} coordinates; "
            f"set {option} {dim}"
        )


class ProjectedRepresentation(nn.Module):
    """``phi(X P)``: a learned linear map ``P`` of every point before another representation (our ablation).

    Not in the paper. Its Sec. 4.2 models are scale-matched (about 1.5 M parameters each), while
    :class:`InContextEigenmap` on 1,280-dim image features has about 11 K, all in the Laplacian's bandwidths and
    the eigenmap: it sees the features only through an RBF graph on the raw space. ``P`` (``input_dim x dim``,
    shared across episodes) lets the model learn which feature directions separate classes across episodes, as
    the Transformer baseline's input projection can. Each projected point is rescaled to the norm ``scale`` (the
    data's ``feature_scale`` after its l2 normalisation), so the Laplacian's bandwidths keep their meaning.

    Args:
        representation: the representation that receives the projected points (e.g. :class:`InContextEigenmap`).
        input_dim: the points' dimension (the feature dimension of the data).
        dim: the projected dimension.
        scale: the norm of every projected point; ``None`` leaves the projection's own scale.
    """

    def __init__(self, representation: nn.Module, input_dim: int, dim: int = 64, scale: float | None = 0.1):
        super().__init__()
        check_int("input_dim", input_dim, minimum=1, hint="the data's feature dimension")
        check_int("dim", dim, minimum=1)
        if scale is not None:
            check_positive("scale", scale, hint="the data's feature_scale, e.g. 0.1")
        self.input_dim, self.dim, self.scale = input_dim, dim, scale
        self.projection = nn.Linear(input_dim, dim, bias=False)
        self.representation = representation

    @property
    def n_points(self) -> int | None:
        return getattr(self.representation, "n_points", None)

    @property
    def out_dim(self) -> int | None:
        return getattr(self.representation, "out_dim", None)

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the projection's input size must be the data's point dimension."""
        check_input_dim(self, datamodule, "--model.init_args.net.init_args.representation.init_args.input_dim")

    def forward(self, x: Tensor) -> Tensor:
        z = self.projection(x.float())
        if self.scale is not None:  # F.normalize clamps the norm, so an all-zero point stays zero
            z = F.normalize(z, dim=-1) * self.scale
        return self.representation(z)


# --------------------------------------------------------------------------------------------------------
# TF_sup: the categorical functional-GD ICL head (Sec. 3.2, App. B-C)
# --------------------------------------------------------------------------------------------------------
class GDICLHead(nn.Module):
    """In-context functional gradient descent for categorical labels (Eq. 6-7, App. C).

    Starting from ``f_0 = 0``, each layer performs (App. C, Eq. 25)

        f_{l+1}(i) = f_l(i) + (alpha / m) sum_{j <= m} [ w_{y_j} - E(w | f_l(j)) ] kappa(phi_i, phi_j)

    for every token ``i``, where only the ``m`` labeled tokens act as keys and values. ``E(w|f)`` is the
    softmax-weighted mean of the class embeddings (Eq. 7); the paper replaces it by one MLP tied across layers
    (App. C.2, ``expectation="mlp"``); ``expectation="exact"`` computes Eq. 7 itself. The logits of token ``i``
    are ``w_c^T f_L(i)`` (Eq. 3). With ``expectation="exact"`` and ``kernel="linear"`` the update is exactly
    gradient descent on the cross-entropy (5) of a linear model ``f = A phi`` started at ``A = 0`` (App. B).

    ``normalize_kernel=True`` (default) divides each query's kernel row by its absolute mass over the labeled
    keys, the softmax-attention form of the update that Sec. 3.2 mentions (``alpha`` then replaces ``alpha / m``;
    for the positive RBF kernel the absolute mass is the plain sum, for the signed linear kernel it keeps the
    update bounded when the labeled kernel values cancel). We
    measured why it is the default: with the unnormalised RBF sum the head, even on fixed good features,
    first collapses to predicting the majority class (points far from every label get ``f ~ 0`` and the
    cheapest loss decrease is the class prior), and end-to-end training of the representation then never
    recovers; the normalised form trains stably from the first step.

    Args:
        num_classes: ``C``.
        embed_dim: ``d'``, the dimension of ``f`` and of the class embeddings ``w_c``.
        mlp_hidden: hidden width of ``MLP_gamma``.
        num_layers: GD steps (the paper uses 1; 2 in App. F.1).
        kernel: ``"rbf"``: ``exp(-gamma ||phi_i - phi_j||^2)``; ``"linear"``: ``phi_i . phi_j``.
        expectation: ``"mlp"`` (paper) or ``"exact"`` (Eq. 7).
        step_size: initial GD step ``alpha`` (learned, as a log).
        gamma: initial RBF inverse bandwidth (learned, as a log).
        normalize_kernel: normalise the kernel over the labeled keys (see above).
    """

    def __init__(
        self,
        num_classes: int = 2,
        embed_dim: int = 16,
        mlp_hidden: int = 16,
        num_layers: int = 1,
        kernel: Kernel = "rbf",
        expectation: Expectation = "mlp",
        step_size: float = 1.0,
        gamma: float = 300.0,
        normalize_kernel: bool = True,
    ):
        super().__init__()
        check_int("num_classes", num_classes, minimum=2, hint="a classifier needs at least 2 classes")
        check_int("embed_dim", embed_dim, minimum=1)
        check_int("mlp_hidden", mlp_hidden, minimum=1)
        check_int("num_layers", num_layers, minimum=1, hint="the ICL head needs at least one GD layer")
        check_literal("kernel", kernel, Kernel)
        check_literal("expectation", expectation, Expectation)
        # Both are stored as logs (learned in log space), so they must be positive.
        check_positive("step_size", step_size, hint="the GD step alpha is learned as a log; e.g. 1.0")
        check_positive("gamma", gamma, hint="the RBF inverse bandwidth is learned as a log; e.g. 300")
        if not isinstance(normalize_kernel, bool):
            raise ConfigError(f"normalize_kernel={normalize_kernel!r} must be true or false")
        self.num_classes = num_classes
        self.num_layers = num_layers
        self.kernel = kernel
        self.expectation = expectation
        self.class_embed = nn.Parameter(torch.randn(num_classes, embed_dim) / math.sqrt(embed_dim))  # w_c
        self.mlp = nn.Sequential(nn.Linear(embed_dim, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, embed_dim))
        self.log_step = nn.Parameter(torch.tensor(math.log(step_size)))
        self.log_gamma = nn.Parameter(torch.tensor(math.log(gamma)), requires_grad=kernel == "rbf")
        self.normalize_kernel = normalize_kernel

    @float32_region
    def kernel_matrix(self, phi: Tensor) -> Tensor:
        """``kappa(phi_i, phi_j)`` for all pairs, ``(B, n, n)``, in float32 (float64 after ``net.double()``)."""
        phi = phi.to(self.class_embed.dtype)
        if self.kernel == "linear":
            return phi @ phi.mT
        return torch.exp(-torch.exp(self.log_gamma) * _sq_dists(phi))

    @float32_region
    def _keys(self, phi: Tensor, labeled_f: Tensor) -> tuple[Tensor, Tensor]:
        """The kernel and each query's step factor: ``kappa (B, n, n)`` and ``alpha / mass_i (B, n, 1)``.

        Only the labeled tokens are keys (Eq. 6). The kernel is not masked: the residuals of unlabeled tokens are
        zero, so ``kappa @ residual`` ignores their columns, and only the mass needs the mask,
        ``mass_i = sum_j |kappa_ij| [j labeled]`` (one product) with ``normalize_kernel``, else ``m``. Scaling
        the rows after the product instead of the kernel before it is the same update (Eq. 25) in fewer kernels.
        """
        kern = self.kernel_matrix(phi)
        step = torch.exp(self.log_step)
        if self.normalize_kernel:
            # The absolute mass: the plain sum for the positive RBF kernel (no abs needed), bounded for the signed
            # linear kernel, whose plain row sum can be negative or ~0.
            weights = kern.abs() if self.kernel == "linear" else kern
            mass = weights @ labeled_f.unsqueeze(-1)
            return kern, step / mass.clamp_min(1e-12)
        return kern, (step / labeled_f.sum(-1).clamp_min(1.0))[:, None, None]

    @float32_region
    def _label_embeddings(self, y: Tensor, labeled_f: Tensor, offset: Tensor | None = None) -> Tensor:
        """``[w_{y_j} - offset] [j labeled]`` for every token, ``(B, n, d')``, as a one-hot product, in float32.

        A one-hot matrix times the embeddings picks rows exactly (one product of 1.0, the rest 0.0), and its backward
        is a matrix product, where an index's backward is a scatter-add (slow and non-deterministic on CUDA). The
        one-hot rows of unlabeled tokens are zero whatever their label (``== arange(C)``, unlike ``F.one_hot``,
        needs no valid class there and no host sync), so their labels, the training targets, never enter.
        """
        classes = torch.arange(self.num_classes, device=y.device)
        onehot = (y.unsqueeze(-1) == classes) * labeled_f.unsqueeze(-1)
        table = self.class_embed if offset is None else self.class_embed - offset
        return onehot @ table

    def expected_embedding(self, f: Tensor) -> Tensor:
        """``E(w | f)`` of Eq. (7): the MLP approximation, or the exact softmax-weighted class embedding."""
        if self.expectation == "mlp":
            return self.mlp(f).to(self.class_embed.dtype)
        return torch.softmax(f @ self.class_embed.T, dim=-1) @ self.class_embed

    def forward(self, phi: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """Logits ``(B, n, C)`` for every token.

        Args:
            phi: ``(B, n, k)`` representation.
            y: ``(B, n)`` labels; only the entries where ``labeled`` is True are read.
            labeled: ``(B, n)`` bool mask of the ``m`` labeled tokens (at least one per episode).
        """
        labeled_f = labeled.to(self.class_embed.dtype)
        kern, scale = self._keys(phi, labeled_f)
        # f_0 = 0, so E(w | f_0) is one vector for every token: the first residual is w_{y_j} - E(w | 0) on labeled
        # tokens, one product with the shifted embedding table (no (B, n, d') zeros, no MLP over them).
        expected0 = self.expected_embedding(self.class_embed.new_zeros(1, self.class_embed.shape[1]))
        f = (kern @ self._label_embeddings(y, labeled_f, expected0)) * scale
        if self.num_layers > 1:
            w_y = self._label_embeddings(y, labeled_f)
            for _ in range(self.num_layers - 1):
                residual = w_y - self.expected_embedding(f) * labeled_f.unsqueeze(-1)
                f = f + (kern @ residual) * scale
        return f @ self.class_embed.T


class ICSSLOutput(NamedTuple):
    """What an IC-SSL net returns: class logits for every token and the representation it classified."""

    logits: Tensor  # (B, n, C)
    features: Tensor  # (B, n, k)


class SemiSupervisedICL(nn.Module):
    """``[Data + Model]`` of Sec. 4.1: a representation ``phi(X)`` of all points, then the GD ICL head.

    Args:
        representation: :class:`InContextEigenmap` (ORIG+E2E-ICL, the default), :class:`LaplacianEigenmap`
            (EIG+ICL) or :class:`RawCoordinates` (ORIG+ICL); any module mapping ``(B, n, d)`` to ``(B, n, k)``.
        head: the classifier; defaults to :class:`GDICLHead` with the paper's one RBF layer.
    """

    def __init__(self, representation: nn.Module | None = None, head: nn.Module | None = None):
        super().__init__()
        self.representation = representation if representation is not None else InContextEigenmap()
        self.head = head if head is not None else GDICLHead()

    @property
    def num_classes(self) -> int:
        """``C``, from the head (2 if the head does not say)."""
        return int(getattr(self.head, "num_classes", 2))

    @property
    def n_points(self) -> int | None:
        """The episode size the representation was built for, or None if it works for any size."""
        return getattr(self.representation, "n_points", None)

    def represent(self, x: Tensor) -> Tensor:
        """``phi(X)``: ``(B, n, d)`` -> ``(B, n, k)``; it never sees labels, so it can be reused across ratios."""
        return self.representation(x)

    def classify(self, features: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """Logits ``(B, n, C)`` from features and the labeled subset."""
        return self.head(features, y, labeled)

    def forward(self, x: Tensor, y: Tensor, labeled: Tensor) -> ICSSLOutput:
        features = self.represent(x)
        return ICSSLOutput(self.classify(features, y, labeled), features)



__all__ = [
    "EigenmapTransformer",
    "GDICLHead",
    "ICSSLOutput",
    "InContextEigenmap",
    "LaplacianEigenmap",
    "LaplacianTransformer",
    "LinearAttentionLayer",
    "ProjectedRepresentation",
    "RBFAttentionLayer",
    "RawCoordinates",
    "SemiSupervisedICL",
]

"""Closed forms of the paper's analysis, shared by mmca's experiments: Theorem 6.2's ``alpha*`` and the Bayes
weights of Eq. (3.3) (used by the synthetic nets, module and data), the ``norm_range`` check of Assumption 6.1, and
the population losses, for initialisation (Theorem 6.3) and as test references.

The population losses integrate over ``Z = 1 + ||m||^2`` with ``||m||`` uniform on ``norm_range`` (App. H), by the
midpoint rule on a fine grid in float64; the integrands are smooth polynomials in ``||m||``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lit_icl.core.validation import check_pair_ordered


def z_grid(norm_range: Sequence[float], points: int = 20001) -> Tensor:
    """Midpoints ``Z_k = 1 + r_k^2`` of ``points`` equal cells of ``r = ||m|| in [lo, hi]`` (float64)."""
    lo, hi = float(norm_range[0]), float(norm_range[1])
    r = lo + (hi - lo) * (torch.arange(points, dtype=torch.float64) + 0.5) / points
    return 1.0 + r * r


def one_parameter_loss(alpha: float | Tensor, depth: int, norm_range: Sequence[float]) -> Tensor:
    """``l(alpha) = E[(Z - 1)/Z (1 - alpha Z)^{2T}]`` (Lemma D.1): the ``L -> inf`` excess error over Bayes.

    It is the mean squared distance of the one-parameter LCA predictor to ``<w, x_q>`` as ``L_te -> inf``
    (the additive constant ``E[1/Z]`` of Lemma D.1 is the Bayes error itself).
    """
    z = z_grid(norm_range)
    a = torch.as_tensor(alpha, dtype=torch.float64).reshape(-1, 1)
    return ((z - 1.0) / z * (1.0 - a * z) ** (2 * depth)).mean(-1).squeeze()


def two_parameter_loss(alpha: float, beta: float, depth: int, norm_range: Sequence[float]) -> float:
    """``l(alpha, beta) = E[(Z-1)/Z (alpha/beta ((1 + beta Z)^T - 1) - 1)^2]`` (Lemma E.1)."""
    z = z_grid(norm_range)
    s = _s(beta, depth, z)
    return float(((z - 1.0) / z * (alpha * s - 1.0) ** 2).mean())


def _s(beta: float, depth: int, z: Tensor) -> Tensor:
    """``S(Z, beta) = ((1 + beta Z)^T - 1) / beta`` with its limit ``T Z`` at ``beta = 0`` (App. E)."""
    if abs(beta) < 1e-12:
        return depth * z
    return ((1.0 + beta * z) ** depth - 1.0) / beta


def theorem63_alpha(beta: float, depth: int, norm_range: Sequence[float]) -> float:
    """``alpha*(beta) = B(beta) / A(beta)`` of Eq. (E.1): the minimiser over ``alpha`` at fixed ``beta``.

    ``A = E[W S^2]``, ``B = E[W S]`` with ``W = (Z - 1)/Z``. Theorem 6.3 starts gradient flow at
    ``(alpha*(beta_0), beta_0)`` with ``beta_0 in (-2/(m_hi + 1), 0)``.
    """
    z = z_grid(norm_range)
    w = (z - 1.0) / z
    s = _s(beta, depth, z)
    return float((w * s).mean() / (w * s * s).mean())


def alpha_star_depth(depth: int, norm_range: Sequence[float], tol: float = 1e-10) -> float:
    """``alpha*_T = argmin l(alpha)`` at finite depth (Lemma D.1: unique, in ``(0, 1)``), by golden section.

    ``l`` is strictly convex (Lemma D.1), so golden-section search on ``(0, 1)`` finds the minimiser.
    """
    lo, hi = 0.0, 1.0
    phi = (5**0.5 - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = float(one_parameter_loss(a, depth, norm_range)), float(one_parameter_loss(b, depth, norm_range))
    while hi - lo > tol:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = float(one_parameter_loss(a, depth, norm_range))
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = float(one_parameter_loss(b, depth, norm_range))
    return 0.5 * (lo + hi)


def lsa_error_floor(norm_range: Sequence[float]) -> float:
    """The smallest ``L_te -> inf`` excess error over Bayes of *any* single-layer LSA (Theorem 4.1, App. B).

    By (B.4) the LSA's limit is ``<w_hat, x_q>`` with ``w_hat = u^T Lambda A + zeta (...) + zeta^2 v b``; only its
    ``zeta``-odd part ``zeta B^T m`` can correlate with ``w = zeta m / Z`` (``zeta`` is symmetric), and by the
    rotation invariance of ``m``'s direction the best ``B`` is ``c I``. The excess error is then
    ``E[(c - 1/Z)^2 (Z - 1) Z]``, minimised at ``c = E[Z - 1] / E[(Z - 1) Z]``. This equals
    ``min_alpha l(alpha)`` at depth 1 (a one-layer LCA *is* an LSA with ``F = alpha X``).
    """
    z = z_grid(norm_range)
    c = (z - 1.0).mean() / ((z - 1.0) * z).mean()
    return float(((c - 1.0 / z) ** 2 * (z - 1.0) * z).mean())


def bayes_mse(norm_range: Sequence[float]) -> float:
    """``E[(y_q - <w, x_q>)^2] = E[zeta^2 / Z] = E[1/Z]`` (Eq. 3.3 with ``E zeta^2 = 1``)."""
    return float((1.0 / z_grid(norm_range)).mean())


def alpha_star(norm_range: Sequence[float]) -> float:
    """``alpha* = 2 / (2 + m_lo + m_hi)`` of Theorem 6.2, where ``m_lo, m_hi`` bound ``||m||^2``.

    ``norm_range`` bounds ``||m||`` (App. H draws it uniformly on ``[0, 5]``), so ``m_lo = lo^2``, ``m_hi = hi^2``:
    ``[0, 5]`` gives ``2 / 27 ~ 0.074``. (App. H quotes ``1/26 ~ 0.04`` for this distribution, which matches none of
    the paper's formulas; we follow Theorem 6.2.)
    """
    lo, hi = float(norm_range[0]), float(norm_range[1])
    return 2.0 / (2.0 + lo * lo + hi * hi)


def check_norm_range(norm_range: Sequence[float]) -> tuple[float, float]:
    """``(lo, hi)`` with ``0 <= lo < hi < inf`` (Assumption 6.1 needs a non-degenerate, bounded ``||m||``)."""
    return check_pair_ordered("norm_range", norm_range, low=0.0, strict=True)


def bayes_weights(m: Tensor, zeta: Tensor) -> Tensor:
    """``w = zeta m / (1 + ||m||^2)`` of Eq. (3.3), per prompt: ``(B, d)``."""
    return zeta.unsqueeze(-1) * m / (1.0 + (m * m).sum(-1, keepdim=True))

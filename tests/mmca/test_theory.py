"""Closed forms shared by mmca's experiments (lit_icl.mmca.theory): Theorem 6.2's alpha*, the Bayes weights of
Eq. (3.3), the finite-depth minimiser of Lemma D.1 and the ``norm_range`` check."""

from __future__ import annotations

import pytest
import torch

from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.mmca.synthetic.data import sample_latent_factor_prompts
from lit_icl.mmca.theory import alpha_star, alpha_star_depth, bayes_weights, check_norm_range, z_grid


def test_bayes_vector_is_lambda_inverse_zeta_m() -> None:
    """Eq. (3.3) via Sherman-Morrison equals the linear-Gaussian regression vector Lambda^{-1} zeta m (Lemma A.1)."""
    b = sample_latent_factor_prompts(16, 2, 5, 3, (0.0, 5.0), make_generator(3, "w", 0))
    m, zeta = b["m"].double(), b["zeta"].double()
    lam = torch.eye(8, dtype=torch.float64) + m.unsqueeze(-1) * m.unsqueeze(-2)
    ref = torch.linalg.solve(lam, (zeta.unsqueeze(-1) * m).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(bayes_weights(m, zeta), ref, atol=1e-12)


def test_alpha_star_of_theorem_6_2() -> None:
    assert alpha_star((0.0, 5.0)) == pytest.approx(2.0 / 27.0)
    assert alpha_star((0.0, 2.0)) == pytest.approx(1.0 / 3.0)
    assert alpha_star((1.0, 2.0)) == pytest.approx(2.0 / 7.0)


def test_finite_depth_minimiser_tends_to_alpha_star() -> None:
    """Theorem 6.2(2): alpha*_T -> alpha* = 2/(2 + m_lo + m_hi); alpha*_1 is the depth-1 minimiser."""
    nr = (0.0, 5.0)
    a = alpha_star(nr)
    gaps = [abs(alpha_star_depth(T, nr) - a) for T in (1, 5, 20, 80)]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 0.1 * gaps[0]
    # Depth 1: l(alpha) = E[W (1 - alpha Z)^2] is minimised at E[W Z] / E[W Z^2] = E[Z-1] / E[(Z-1) Z].
    z = z_grid(nr)
    assert alpha_star_depth(1, nr) == pytest.approx(float((z - 1).mean() / ((z - 1) * z).mean()), rel=1e-6)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ((3.0, 1.0), "norm_range=(3.0, 1.0) must be (low, high) with low < high"),
        ((2.0, 2.0), "with low < high"),
        ((-1.0, 1.0), "both ends must lie in [0, inf)"),
        ((0.0, float("inf")), "must be a finite number"),
        ((1.0,), "must be a (low, high) pair of two numbers"),
    ],
)
def test_norm_range_must_be_an_ordered_non_negative_pair(value, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_norm_range(value)
    assert needle in str(info.value)
    assert check_norm_range([0, 5]) == (0.0, 5.0)

"""mmca nets against independent computations: the explicit LSA of Eq. (4.2), a token-level CA recursion,
Lemma C.2, the closed forms of Lemma D.1 / E.1, Theorem 4.1's error floor and the parameter counts."""

from __future__ import annotations

import itertools

import pytest
import torch

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import count_parameters
from lit_icl.core.seeding import make_generator
from lit_icl.mmca.synthetic.data import sample_latent_factor_prompts
from lit_icl.mmca.synthetic.diagnostics import whitening_residuals
from lit_icl.mmca.synthetic.nets import (
    BayesOptimal,
    DeepCrossAttention,
    SampleMean,
    SingleLayerLSA,
    lsa_readout,
)
from lit_icl.mmca.theory import (
    alpha_star,
    alpha_star_depth,
    bayes_weights,
    lsa_error_floor,
    one_parameter_loss,
    theorem63_alpha,
    two_parameter_loss,
)


def _prompts(
    n: int, L: int, d1: int = 2, d2: int = 2, norm_range=(0.0, 5.0), seed: int = 0
) -> dict[str, torch.Tensor]:
    return sample_latent_factor_prompts(n, L, d1, d2, norm_range, make_generator(seed, "nets-test", n, L))


def _bayes(b: dict[str, torch.Tensor]) -> torch.Tensor:
    return (bayes_weights(b["m"], b["zeta"]) * b["x_query"]).sum(-1)


def _icl_error(net, b, **kw) -> float:
    with torch.no_grad():
        return float((net(b["x"], b["y"], b["x_query"], b["m"], b["zeta"], **kw) - _bayes(b)).pow(2).mean())


# ----------------------------------------------------------------------------------------- reference maths
def explicit_lsa(
    x: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, w_pv: torch.Tensor, w_kq: torch.Tensor
) -> torch.Tensor:
    """Eq. (4.2) literally, float64: build E, compute E + W^PV E (E^T W^KQ E / L), read entry (d+1, L+1)."""
    x, y, xq, w_pv, w_kq = (t.double() for t in (x, y, xq, w_pv, w_kq))
    B, L, d = x.shape
    e = torch.zeros(B, d + 1, L + 1, dtype=torch.float64)
    e[:, :d, :L] = x.transpose(1, 2)
    e[:, d, :L] = y
    e[:, :d, L] = xq
    out = e + w_pv @ e @ (e.transpose(1, 2) @ w_kq @ e) / L
    return out[:, d, L]


def reference_stack(net: DeepCrossAttention, x: torch.Tensor) -> list[torch.Tensor]:
    """Eqs. (5.2)-(5.4) / (G.1)-(G.2) token by token in float64, from the net's dense layer weights."""
    ws, wv = (w.double() for w in net.layer_weights())
    X = x.double().transpose(1, 2)  # (B, d, L)
    L = X.shape[-1]
    F = X.clone() if net.initial_state == "x" else torch.zeros_like(X)
    out = []
    for t in range(net.depth):
        K = X if net.mixer == "cross" else F  # W^K = I
        V = wv[t] @ K  # values come from the keys' source
        scores = K.transpose(1, 2) @ F / L  # (B, L_keys, L_queries); W^Q = I
        attn = scores if net.attention == "linear" else torch.softmax(scores, dim=1)
        F = F + (ws[t] @ X) + V @ attn
        out.append(F)
    return out


def test_lsa_readout_equals_eq_4_2_for_any_weights() -> None:
    b = _prompts(6, 9)
    g = make_generator(1, "w")
    w_pv, w_kq = torch.randn(5, 5, generator=g), torch.randn(5, 5, generator=g)
    fast = lsa_readout(b["x"].transpose(1, 2), b["y"], b["x_query"], w_pv, w_kq)
    assert torch.allclose(
        fast.double(), explicit_lsa(b["x"], b["y"], b["x_query"], w_pv, w_kq), rtol=1e-4, atol=1e-4
    )
    net = SingleLayerLSA(d=4, init_noise=0.3, init_seed=2)
    ref = explicit_lsa(b["x"], b["y"], b["x_query"], net.w_pv.detach(), net.w_kq.detach())
    assert torch.allclose(net(b["x"], b["y"], b["x_query"]).double(), ref, rtol=1e-4, atol=1e-4)


CASES = [
    {"parametrization": p, "attention": a, "mixer": mx, "injection": inj, "initial_state": s0}
    for p, a, mx, inj, s0 in itertools.product(
        ("one", "two", "untied", "diagonal", "full"),
        ("linear", "softmax"),
        ("cross", "self"),
        (True, False),
        ("zero", "x"),
    )
    if not (p == "two" and not inj)
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_ca_stack_matches_token_level_recursion(kw) -> None:
    """Every variant (incl. the O(d^3) linear fast path) equals Eq. (5.2)-(5.5) computed token by token."""
    b = _prompts(3, 7)
    net = DeepCrossAttention(d=4, depth=3, init_noise=0.2, init_seed=5, alpha_init=0.2, **kw)
    states = net.layer_states(b["x"])
    ref = reference_stack(net, b["x"])
    for f, r in zip(states, ref):
        assert torch.allclose(f.double(), r, rtol=1e-4, atol=1e-4)
    # The readout of Eq. (5.5) with the App. C.1 matrices, written out on E_F.
    pred = net(b["x"], b["y"], b["x_query"])
    x_f = ref[-1].transpose(1, 2)
    expect = explicit_lsa(x_f, b["y"], b["x_query"], net.w_pv, net.w_kq)
    assert torch.allclose(pred.double(), expect, rtol=1e-4, atol=1e-4)


def test_trainable_readout_uses_the_general_lsa() -> None:
    b = _prompts(3, 7)
    net = DeepCrossAttention(d=4, depth=2, parametrization="two", readout_trainable=True, alpha_init=0.2)
    with torch.no_grad():
        net.w_kq.add_(0.1 * torch.randn(5, 5, generator=make_generator(9)))
        net.w_pv.add_(0.1 * torch.randn(5, 5, generator=make_generator(8)))
    x_f = reference_stack(net, b["x"])[-1].transpose(1, 2)
    expect = explicit_lsa(x_f, b["y"], b["x_query"], net.w_pv.detach(), net.w_kq.detach())
    assert torch.allclose(net(b["x"], b["y"], b["x_query"]).double(), expect, rtol=1e-4, atol=1e-4)


def test_lemma_c2_closed_form_of_the_tied_lca() -> None:
    """F_T = alpha sum_k M^k X with M = I + beta Lambda_hat, and X F^T / L = (alpha/beta)((I + beta Lambda_hat)^T - I)."""
    b = _prompts(4, 30, d1=3, d2=2)
    alpha, beta, T = 0.15, -0.12, 6
    net = DeepCrossAttention(d=5, depth=T, parametrization="two", alpha_init=alpha, beta_init=beta)
    X = b["x"].double().transpose(1, 2)
    lam = X @ X.transpose(1, 2) / 30
    eye = torch.eye(5, dtype=torch.float64)
    closed = alpha / beta * (torch.linalg.matrix_power(eye + beta * lam, T) - eye)
    F = net.layer_states(b["x"])[-1].double()
    assert torch.allclose(X @ F.transpose(1, 2) / 30, closed, atol=1e-5)
    # Lemma C.1: the readout is y^T F^T x_q / L.
    pred = net(b["x"], b["y"], b["x_query"]).double()
    assert torch.allclose(
        pred,
        (b["y"].double().unsqueeze(1) @ F.transpose(1, 2) @ b["x_query"].double().unsqueeze(-1)).flatten()
        / 30,
        atol=1e-5,
    )
    # The whitening residual of the one-parameter model is ||(I - alpha Lambda_hat)^T||_F / sqrt(d).
    one = DeepCrossAttention(d=5, depth=T, alpha_init=alpha)
    res = whitening_residuals(b["x"], one.layer_states(b["x"]))
    expect = torch.linalg.matrix_power(eye - alpha * lam, T).flatten(1).norm(dim=-1) / 5**0.5
    assert torch.allclose(res[:, -1].double(), expect, atol=1e-5)


def test_one_parameter_lca_approaches_bayes_as_depth_and_context_grow() -> None:
    """With alpha = alpha*, the excess error over <w, x_q> tends, as L -> inf, to the closed form
    c(m, zeta) = zeta^2 (Z-1)/Z (1 - alpha Z)^{2T} per prompt, whose mean is l(alpha) of Lemma D.1; l(alpha*) in turn
    vanishes geometrically in T (Remark C.3).

    The LCA's prediction is linear in x_q, y_hat = g^T x_q, so the error averaged over x_q ~ N(0, Lambda) is exactly
    (g - w)^T Lambda (g - w) per prompt: comparing that with c on the same prompts leaves only the finite-L effect.
    """
    nr = (0.0, 5.0)
    a = alpha_star(nr)
    closed = {T: float(one_parameter_loss(a, T, nr)) for T in (1, 3, 10, 40)}
    assert closed[1] > closed[3] > closed[10] > closed[40] and closed[40] < 1e-4
    n, d = 2000, 4
    big = _prompts(n, 4000, seed=1)
    m, zeta = big["m"].double(), big["zeta"].double()
    z = 1 + (m * m).sum(-1)
    lam = torch.eye(d, dtype=torch.float64) + m.unsqueeze(-1) * m.unsqueeze(-2)
    w = bayes_weights(m, zeta)

    def excess(T: int, L: int) -> torch.Tensor:
        net = DeepCrossAttention(d=d, depth=T)
        with torch.no_grad():
            g = torch.stack(
                [net(big["x"][:, :L], big["y"][:, :L], torch.eye(d)[k].expand(n, d)) for k in range(d)], -1
            )
        diff = g.double() - w
        return (diff.unsqueeze(1) @ lam @ diff.unsqueeze(-1)).flatten()

    for T in (1, 3, 10):
        c = zeta**2 * (z - 1) / z * (1 - a * z) ** (2 * T)
        se = float(c.std()) / n**0.5
        assert abs(float(c.mean()) - closed[T]) < 4 * se  # the sampled prompts follow the closed form
        e1000, e4000 = excess(T, 1000), excess(T, 4000)
        gap = float((e4000 - c).mean())
        gap_se = float((e4000 - c).std()) / n**0.5
        assert abs(gap) < 4 * gap_se + 0.15 * float(c.mean()), (T, gap, gap_se)
        assert float((e1000 - c).mean()) >= gap - 2 * gap_se  # no closer at L = 1000 than at L = 4000
    deep = {L: float(excess(40, L).mean()) for L in (1000, 4000)}
    assert deep[4000] < deep[1000] and deep[4000] < 2e-3  # Bayes scores 0; closed[40] ~ 1.6e-5


def test_theorem_6_3_initialisation_minimises_the_two_parameter_loss_in_alpha() -> None:
    nr, T, beta0 = (0.0, 2.0), 5, -0.2
    a0 = theorem63_alpha(beta0, T, nr)
    for h in (1e-3, -1e-3, 0.05, -0.05):
        assert two_parameter_loss(a0 + h, beta0, T, nr) > two_parameter_loss(a0, beta0, T, nr)
    # With beta = -alpha the two-parameter loss is the one-parameter loss (Lemma E.1 vs D.1).
    assert two_parameter_loss(0.3, -0.3, T, nr) == pytest.approx(
        float(one_parameter_loss(0.3, T, nr)), rel=1e-9
    )
    net = DeepCrossAttention(
        d=4, depth=T, parametrization="two", init="theorem_6_3", beta_init=beta0, norm_range=nr
    )
    assert float(net.alpha.detach()) == pytest.approx(a0, rel=1e-6) and float(
        net.beta.detach()
    ) == pytest.approx(beta0)


def test_app_h_initialisation_near_alpha_star() -> None:
    a = 2 / 27
    net = DeepCrossAttention(d=4, depth=3, parametrization="full", init_noise=0.0)
    ws, wv = net.layer_weights()
    assert torch.allclose(ws, a * torch.eye(4).expand(3, 4, 4)) and torch.allclose(
        wv, -a * torch.eye(4).expand(3, 4, 4)
    )
    noisy = DeepCrossAttention(d=32, depth=10, parametrization="diagonal", init_noise=0.1, init_seed=3)
    dev = noisy.alpha.detach() - a
    assert abs(float(dev.mean())) < 0.02 and abs(float(dev.std()) - 0.1) < 0.02
    same = DeepCrossAttention(d=32, depth=10, parametrization="diagonal", init_noise=0.1, init_seed=3)
    assert torch.equal(same.beta, noisy.beta)


def test_single_layer_lsa_keeps_an_error_floor_when_norm_m_varies() -> None:
    """Theorem 4.1. Every LSA prediction is p^T (E E^T / L) W^KQ [x_q; 0] = sum_{cab} p_c W^KQ_ab G_ca x_q,b, i.e.
    linear in the tensor theta = p (x) W^KQ. Least squares over *all* theta (a superset of every LSA) still
    cannot beat the closed-form floor when ||m|| varies; it can when ||m|| is fixed; the LCA goes far below."""
    nr = (0.0, 5.0)
    floor = lsa_error_floor(nr)
    assert floor == pytest.approx(float(one_parameter_loss(alpha_star_depth(1, nr), 1, nr)), rel=1e-6)

    def features(b: dict[str, torch.Tensor]) -> torch.Tensor:
        x, y, xq = b["x"].double(), b["y"].double(), b["x_query"].double()
        B, L, _d = x.shape
        e = torch.cat(
            [
                torch.cat([x, y.unsqueeze(-1)], -1),
                torch.cat([xq, torch.zeros(B, 1, dtype=x.dtype)], -1).unsqueeze(1),
            ],
            1,
        )
        g = e.transpose(1, 2) @ e / L  # (B, d+1, d+1): E E^T / L including the query column
        return (g.unsqueeze(-1) * xq[:, None, None, :]).flatten(1)  # (B, (d+1)^2 d)

    def relaxed_floor(norm_range) -> float:
        train = _prompts(8000, 400, norm_range=norm_range, seed=2)
        test = _prompts(4000, 400, norm_range=norm_range, seed=3)
        theta = torch.linalg.lstsq(features(train), _bayes(train).double().unsqueeze(-1)).solution
        return float((features(test) @ theta).squeeze(-1).sub(_bayes(test).double()).pow(2).mean())

    varying = relaxed_floor(nr)
    assert varying > 0.85 * floor and floor > 0.2
    fixed = relaxed_floor((3.0, 3.01))
    assert fixed < 0.1 * floor  # fixed ||m||: a single LSA scale c = 1/(1 + ||m||^2) is Bayes-optimal
    test = _prompts(4000, 400, seed=3)
    lca = DeepCrossAttention(d=4, depth=10, alpha_init=alpha_star_depth(10, nr))
    assert _icl_error(lca, test) < 0.15 * floor
    # A single-layer LSA trained by gradient steps lands above the floor too.
    torch.manual_seed(0)
    lsa = SingleLayerLSA(d=4)
    train = _prompts(4000, 100, seed=4)
    opt = torch.optim.Adam(lsa.parameters(), lr=0.01)
    for _ in range(300):
        loss = (lsa(train["x"], train["y"], train["x_query"]) - train["y_query"]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert 0.85 * floor < _icl_error(lsa, test) < 3 * floor


@pytest.mark.parametrize(
    ("kw", "count"),
    [
        ({"parametrization": "one"}, 1),
        ({"parametrization": "two"}, 2),
        ({"parametrization": "untied"}, 2 * 10),
        ({"parametrization": "diagonal"}, 2 * 10 * 32),
        ({"parametrization": "full"}, 2 * 10 * 32 * 32),
        ({"parametrization": "one", "injection": False}, 1),
        ({"parametrization": "untied", "injection": False}, 10),
        ({"parametrization": "diagonal", "injection": False}, 10 * 32),
        ({"parametrization": "full", "injection": False}, 10 * 32 * 32),
        ({"parametrization": "two", "mixer": "self"}, 2),
        ({"parametrization": "one", "attention": "softmax"}, 1),
        ({"parametrization": "two", "readout_trainable": True}, 2 + 2 * 33 * 33),
    ],
)
def test_parameter_counts(kw, count) -> None:
    assert count_parameters(DeepCrossAttention(d=32, depth=10, **kw)) == count


def test_baselines_have_no_parameters_and_compute_their_formulas() -> None:
    assert count_parameters(SingleLayerLSA(d=32)) == 2 * 33 * 33
    b = _prompts(5, 6)
    assert count_parameters(SampleMean()) == 0 and count_parameters(BayesOptimal()) == 0
    assert torch.allclose(SampleMean()(b["x"], b["y"], b["x_query"]), b["y"].mean(-1))
    assert torch.allclose(BayesOptimal()(b["x"], b["y"], b["x_query"], b["m"], b["zeta"]), _bayes(b))
    with pytest.raises(ValueError, match="needs the prompt's latent"):
        BayesOptimal()(b["x"], b["y"], b["x_query"])


def test_tied_nets_run_at_other_depths_untied_do_not() -> None:
    b = _prompts(3, 5)
    tied = DeepCrossAttention(d=4, depth=3)
    deeper = DeepCrossAttention(d=4, depth=5)
    assert torch.allclose(tied(b["x"], b["y"], b["x_query"], depth=5), deeper(b["x"], b["y"], b["x_query"]))
    with pytest.raises(ValueError, match="untied weights"):
        DeepCrossAttention(d=4, depth=3, parametrization="untied")(b["x"], b["y"], b["x_query"], depth=5)


def test_no_injection_from_zero_state_predicts_zero() -> None:
    """Eq. (G.1) with F_0 = 0: linear attention never leaves F = 0 (prediction 0, error E[W])."""
    b = _prompts(4, 6)
    net = DeepCrossAttention(d=4, depth=4, injection=False)
    assert torch.equal(net(b["x"], b["y"], b["x_query"]), torch.zeros(4))


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"d": 0}, "d=0 must be >= 1; the covariate dimension"),
        ({"depth": 0}, "depth=0 must be >= 1"),
        ({"parametrization": "fulll"}, "parametrization='fulll' is not a valid choice; choose one of 'one'"),
        ({"attention": "relu"}, "attention='relu' is not a valid choice"),
        ({"mixer": "both"}, "mixer='both' is not a valid choice"),
        ({"parametrization": "two", "injection": False}, "needs injection=True"),
        ({"init_noise": -0.1}, "init_noise=-0.1"),
        ({"init": "theorem_6_3", "parametrization": "two"}, "needs beta_init in (-2/(m_hi+1), 0)"),
        ({"init": "theorem_6_3", "parametrization": "two", "beta_init": -0.5}, "needs beta_init in"),
        (
            {"init": "theorem_6_3", "parametrization": "two", "beta_init": -0.05, "alpha_init": 0.1},
            "drop alpha_init",
        ),
        ({"parametrization": "one", "beta_init": -0.1}, "ties beta = -alpha"),
        ({"norm_range": (2.0, 2.0)}, "must be (low, high) with low < high"),
        ({"alpha_init": float("nan")}, "alpha_init=nan must be a finite number"),
    ],
)
def test_bad_net_arguments(kw, needle) -> None:
    with pytest.raises(ConfigError) as info:
        DeepCrossAttention(**kw)
    assert needle in str(info.value)

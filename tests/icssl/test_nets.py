"""The IC-SSL networks against the paper's constructions and independent computations."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import count_parameters
from lit_icl.core.spectral import knn_rbf_adjacency, laplacian_eigenmap, pairwise_sq_dists
from lit_icl.icssl.nets import (
    EigenmapTransformer,
    GDICLHead,
    InContextEigenmap,
    LaplacianEigenmap,
    LaplacianTransformer,
    ProjectedRepresentation,
    RawCoordinates,
    SemiSupervisedICL,
)


def _points(b: int = 3, n: int = 30, d: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("exclude_self", [False, True])
def test_lemma1_construction_gives_right_normalized_laplacian(exclude_self: bool) -> None:
    """Lemma 1: one RBF-attention layer with M = I, a' = -1 outputs L_hat = I - A D^{-1} (Eq. 12-14)."""
    n, sigma = 30, 0.8
    x = _points(n=n)
    net = LaplacianTransformer.from_lemma1(n, sigma, exclude_self=exclude_self)
    x_out, psi = net(x)

    # Independent computation in float64 with explicit loops over the definition.
    xd = x.double()
    a = torch.exp(-((xd[:, :, None, :] - xd[:, None, :, :]) ** 2).sum(-1) / sigma**2)
    if exclude_self:
        a = a * (1 - torch.eye(n, dtype=torch.float64))
    d = a.sum(dim=1)  # D_jj = sum_k A_kj
    l_hat = torch.eye(n, dtype=torch.float64) - a / d[:, None, :]  # A D^{-1} scales column j by 1/D_jj
    # Token j holds column j of L_hat: our token-major block is L_hat^T.
    torch.testing.assert_close(psi.double(), l_hat.transpose(-1, -2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x_out, x)  # a = s = 0 leaves the coordinates untouched
    # Columns of A D^{-1} sum to one, so every column of L_hat sums to zero.
    assert psi.sum(-1).abs().max() < 1e-5


def test_rbf_attention_is_translation_and_rotation_invariant() -> None:
    """Tied query/key scales make TF^L depend on distances only (App. D poses must not matter)."""
    torch.manual_seed(0)
    net = LaplacianTransformer(n_points=30, num_layers=2)
    x = _points(n=30) * 0.05
    q, _ = torch.linalg.qr(torch.randn(3, 3))
    _, psi = net(x)
    _, psi_moved = net(x @ q + torch.tensor([0.7, -0.3, 0.2]))
    torch.testing.assert_close(psi, psi_moved, atol=1e-4, rtol=1e-4)


def _subspace_sin(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Largest sine of the principal angles between the column spaces of orthonormal ``u`` and ``v``."""
    s = torch.linalg.svdvals(u.transpose(-1, -2) @ v)
    return torch.sqrt((1 - s.min() ** 2).clamp_min(0))


def test_lemma2_construction_recovers_bottom_eigenvectors() -> None:
    """Lemma 2: power step + Gram-Schmidt layers = block power iteration -> bottom eigvecs of Psi^T Psi."""
    n, k = 40, 3
    # A Laplacian block from Lemma 1 on a noisy circle: a realistic input with a small bottom spectrum.
    t = torch.rand(2, n, generator=torch.Generator().manual_seed(1)) * 2 * math.pi
    x = torch.stack([t.cos(), t.sin(), 0.05 * torch.randn(2, n)], -1)
    with torch.no_grad():
        _, psi = LaplacianTransformer.from_lemma1(n, sigma=0.5, exclude_self=True)(x)
    gram = psi.double() @ psi.double().transpose(-1, -2)  # paper's Psi^T Psi, G_ij = psi_i . psi_j
    evals, evecs = torch.linalg.eigh(gram)
    mu = float(evals.max()) * 1.05
    net = EigenmapTransformer.from_lemma2(n, k, mu=mu, iterations=3000)
    phi = net(psi).double()
    for b in range(2):
        assert evals[b, k] - evals[b, k - 1] > 1e-3, "test input needs a spectral gap"
        assert _subspace_sin(phi[b], evecs[b, :, :k]) < 1e-2
    # Columns are orthonormal: the Gram-Schmidt layers plus normalisation implement QR.
    eye = torch.eye(k, dtype=torch.float64)
    torch.testing.assert_close(phi.transpose(-1, -2) @ phi, eye.expand(2, k, k), atol=1e-4, rtol=0)


def test_lemma2_gram_schmidt_layer_orthogonalises_one_column() -> None:
    """A single GS layer of the Lemma 2 proof removes column i's projection on columns j < i."""
    n, k = 20, 3
    net = EigenmapTransformer.from_lemma2(n, k, mu=1.0, iterations=1)
    layer = net.layers[2]  # orthogonalises column 2 against columns 0 and 1
    q, _ = torch.linalg.qr(torch.randn(1, n, 2))
    c = torch.randn(1, n, 1)
    phi = torch.cat([q, c / c.norm()], -1)
    out = layer(phi, torch.zeros(1, n, n))
    expected = c - q @ (q.transpose(-1, -2) @ c)
    torch.testing.assert_close(out[..., 2:], expected / expected.norm(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[..., :2], q, atol=1e-6, rtol=1e-6)


def test_gd_head_equals_gradient_descent_on_cross_entropy() -> None:
    """App. B-C: with the exact E(w|f) and a linear kernel, L layers = L GD steps on Eq. (5) for f = A phi."""
    torch.manual_seed(0)
    b, n, k, c, dp, steps, alpha = 2, 25, 4, 3, 5, 3, 0.7
    head = GDICLHead(num_classes=c, embed_dim=dp, num_layers=steps, kernel="linear", expectation="exact",
                     step_size=alpha, normalize_kernel=False)
    phi = torch.randn(b, n, k)
    y = torch.randint(0, c, (b, n))
    labeled = torch.zeros(b, n, dtype=torch.bool)
    labeled[0, :7] = True
    labeled[1, :11] = True
    logits = head(phi, y, labeled)

    w = head.class_embed.detach()
    for e in range(b):
        a = torch.zeros(dp, k, requires_grad=True)  # f(phi) = A phi, started at A = 0 (f_0 = 0)
        idx = labeled[e].nonzero().flatten()
        for _ in range(steps):
            f = phi[e, idx] @ a.T
            loss = torch.nn.functional.cross_entropy(f @ w.T, y[e, idx])  # Eq. (5), mean over the m labels
            (grad,) = torch.autograd.grad(loss, a)
            a = (a - alpha * grad).detach().requires_grad_()
        expected = (phi[e] @ a.T) @ w.T
        torch.testing.assert_close(logits[e], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("normalize", [False, True])
def test_gd_head_rbf_update_matches_eq6(normalize: bool) -> None:
    """One RBF layer: f_1(i) = (alpha/m) sum_j [w_{y_j} - MLP(0)] exp(-gamma ||phi_i - phi_j||^2) (Eq. 6, 25);
    the normalised form divides by sum_j kappa_ij instead of m."""
    torch.manual_seed(1)
    head = GDICLHead(num_classes=2, embed_dim=6, mlp_hidden=8, num_layers=1, gamma=3.0, step_size=0.5,
                     normalize_kernel=normalize)
    phi, y = torch.randn(1, 12, 2), torch.randint(0, 2, (1, 12))
    labeled = torch.arange(12)[None] < 5
    logits = head(phi, y, labeled)
    w = head.class_embed
    e0 = head.mlp(torch.zeros(6))
    f = torch.zeros(12, 6)
    for i in range(12):
        kern = [math.exp(-3.0 * float(((phi[0, i] - phi[0, j]) ** 2).sum())) for j in range(5)]
        scale = 0.5 / sum(kern) if normalize else 0.5 / 5
        for j in range(5):
            f[i] += scale * (w[y[0, j]] - e0) * kern[j]
    torch.testing.assert_close(logits[0], f @ w.T, atol=1e-5, rtol=1e-4)



def test_gd_head_normalised_linear_kernel_divides_by_absolute_mass() -> None:
    """The signed linear kernel, normalised: f_1(i) = alpha sum_j [w_{y_j} - MLP(0)] k_ij / sum_j |k_ij|.

    A query whose labeled kernel values cancel (+1 and -1: the plain sum is 0) gets a bounded update. Dividing by
    the plain sum clamped at 1e-12, as before, made it ~1e12 and left the linear-kernel models below chance."""
    torch.manual_seed(2)
    head = GDICLHead(num_classes=2, embed_dim=6, mlp_hidden=8, num_layers=1, kernel="linear", step_size=0.5)
    phi = torch.randn(1, 10, 3)
    phi[0, 0], phi[0, 1], phi[0, 9] = torch.tensor([1.0, 0, 0]), torch.tensor([-1.0, 0, 0]), torch.tensor([1.0, 0, 0])
    y = torch.tensor([[0, 1, 0, 1, 0, 1, 0, 1, 0, 1]])
    labeled = torch.arange(10)[None] < 2  # keys: phi_0 = e1 and phi_1 = -e1
    logits = head(phi, y, labeled)
    w, e0 = head.class_embed, head.mlp(torch.zeros(6))
    f = torch.zeros(10, 6)
    for i in range(10):
        kern = [float(phi[0, i] @ phi[0, j]) for j in range(2)]
        mass = sum(abs(v) for v in kern)
        for j in range(2):
            f[i] += 0.5 * (w[y[0, j]] - e0) * kern[j] / max(mass, 1e-12)
    torch.testing.assert_close(logits[0], f @ w.T, atol=1e-5, rtol=1e-4)
    # Query 9 = e1: kernel row (+1, -1) sums to 0; its update is (w_0 - w_1) / 2 * alpha, bounded.
    torch.testing.assert_close(f[9], 0.25 * (w[0] - w[1]), atol=1e-6, rtol=1e-5)
    assert logits.abs().max() < 100


def test_one_step_linear_head_normalisation_rescales_logit_margins_only() -> None:
    """With one GD step from f_0 = 0, normalising a kernel row multiplies that point's logits' margins by the
    positive factor (m / sum_j |k_ij|): the tuned and the faithful (Eq. 6) linear heads express the same decision
    rules on the same features (docs/icssl.md and experiments/results/icssl_cpu.md), so a faithful model stuck at the class
    prior is a training outcome, not a limit of what the head can represent."""
    torch.manual_seed(3)
    normed = GDICLHead(num_classes=2, embed_dim=6, mlp_hidden=8, num_layers=1, kernel="linear")
    plain = GDICLHead(num_classes=2, embed_dim=6, mlp_hidden=8, num_layers=1, kernel="linear",
                      normalize_kernel=False)
    plain.load_state_dict(normed.state_dict())
    phi = torch.randn(3, 40, 4)
    y = torch.randint(0, 2, (3, 40))
    labeled = torch.rand(3, 40) < 0.3
    labeled[:, 0] = True
    a, b = normed(phi, y, labeled), plain(phi, y, labeled)
    margin_a, margin_b = a[..., 1] - a[..., 0], b[..., 1] - b[..., 0]
    kern = (phi @ phi.transpose(-1, -2)) * labeled[:, None, :]
    factor = labeled.sum(-1, keepdim=True) / kern.abs().sum(-1)  # m / absolute row mass, > 0
    torch.testing.assert_close(margin_a, margin_b * factor, atol=1e-5, rtol=1e-4)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_gd_head_never_reads_labels_of_unlabeled_points() -> None:
    head = GDICLHead()
    phi = torch.randn(2, 30, 4)
    y = torch.randint(0, 2, (2, 30))
    labeled = torch.arange(30)[None].expand(2, 30) < 6
    flipped = torch.where(labeled, y, 1 - y)
    torch.testing.assert_close(head(phi, y, labeled), head(phi, flipped, labeled))


def test_laplacian_eigenmap_matches_eigh_of_knn_graph() -> None:
    x = _points(b=2, n=40)
    phi = laplacian_eigenmap(x, n_components=4, n_neighbors=6, rbf_scale=10.0)
    a = knn_rbf_adjacency(x, 6, 10.0).double()
    assert torch.equal(a, a.transpose(-1, -2))
    assert (a > 0).sum(-1).min() >= 6  # every point keeps its 6 neighbours (symmetrised graph)
    deg = a.sum(-1)
    lap = torch.eye(40, dtype=torch.float64) - a / torch.sqrt(deg[:, :, None] * deg[:, None, :])
    _evals, evecs = torch.linalg.eigh(lap)
    for b in range(2):
        assert _subspace_sin(phi[b].double(), evecs[b, :, :4]) < 1e-3


def test_pairwise_sq_dists_matches_cdist() -> None:
    x = _points(n=17, d=5)
    torch.testing.assert_close(pairwise_sq_dists(x), torch.cdist(x, x) ** 2, atol=1e-4, rtol=1e-4)


def test_e2e_net_shapes_parameter_count_and_permutation_equivariance_of_baselines() -> None:
    net = SemiSupervisedICL()
    x, y = _points(b=2, n=100) * 0.05, torch.randint(0, 2, (2, 100))
    labeled = torch.arange(100)[None].expand(2, 100) < 25
    out = net(x, y, labeled)
    assert out.logits.shape == (2, 100, 2) and out.features.shape == (2, 100, 4)
    assert torch.isfinite(out.logits).all()
    # App. H reports 10,852 parameters for ORIG+E2E-ICL; ours is of the same order.
    assert 8_000 < count_parameters(net) < 14_000
    # The baselines have no position-specific parameters: permuting points permutes predictions.
    perm = torch.randperm(100)
    lab_p = torch.zeros(2, 100, dtype=torch.bool)
    lab_p[:, perm[:25]] = True
    for rep in (RawCoordinates(), LaplacianEigenmap()):
        model = SemiSupervisedICL(rep, GDICLHead(gamma=100.0))
        inv = perm.argsort()
        a = model(x, y, lab_p).logits
        b = model(x[:, perm], y[:, perm], lab_p[:, perm]).logits[:, inv]
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_bad_net_configurations_raise_clear_errors() -> None:
    with pytest.raises(ConfigError, match="n_points=100"):
        InContextEigenmap(n_points=100)(torch.randn(1, 50, 3))
    with pytest.raises(ConfigError, match="n_neighbors=60"):
        LaplacianEigenmap(n_neighbors=60)(torch.randn(1, 50, 3))
    with pytest.raises(ConfigError, match="kernel"):
        GDICLHead(kernel="cosine")  # type: ignore[arg-type]


def test_linear_activation_ablation_is_the_unnormalised_linear_kernel() -> None:
    """Table 6's "Lap (linear)": kappa_ij = (<x_i, x_j>/sigma^2 + <psi_i, psi_j>/rho^2) / n, no softmax."""
    from lit_icl.icssl.nets import RBFAttentionLayer

    torch.manual_seed(0)
    layer = RBFAttentionLayer([0.5, 2.0], exclude_self=True, activation="linear")
    x, psi = torch.randn(2, 7, 3), torch.randn(2, 7, 7)
    w = layer.attention(x, psi)
    for h, sigma in enumerate([0.5, 2.0]):
        rho = 10.0
        for b in range(2):
            for i in range(7):
                for j in range(7):
                    expected = 0.0 if i == j else float(
                        (x[b, i] @ x[b, j]) / sigma**2 + (psi[b, i] @ psi[b, j]) / rho**2
                    ) / 7
                    assert w[b, h, i, j].item() == pytest.approx(expected, rel=1e-4, abs=1e-6)
    net = InContextEigenmap(n_points=20, lap_activation="linear")
    assert all(layer.activation == "linear" for layer in net.laplacian.layers)
    assert net(torch.randn(3, 20, 3)).shape == (3, 20, 4)


def test_fixed_init_makes_the_representation_size_free_and_permutation_equivariant() -> None:
    """Remark 1: with learn_init=False no parameter depends on n, and permuting the points permutes phi."""
    sizes = {n: count_parameters(InContextEigenmap(n_points=n, learn_init=False)) for n in (50, 100, 200)}
    assert len(set(sizes.values())) == 1
    assert count_parameters(InContextEigenmap(n_points=100)) - sizes[100] == 100 * 100 + 100 * 4
    torch.manual_seed(0)
    net = InContextEigenmap(n_points=40, learn_init=False)
    x = 0.05 * torch.randn(2, 40, 3)
    perm = torch.randperm(40)
    torch.testing.assert_close(net(x[:, perm]), net(x)[:, perm], atol=2e-5, rtol=1e-4)


def test_faithful_eigenmap_init_is_lemma2() -> None:
    a = EigenmapTransformer(30, 4, num_layers=4, num_heads=1, init="lemma2", mu=3.0)
    b = EigenmapTransformer.from_lemma2(30, 4, mu=3.0, iterations=4)
    for la, lb in zip(a.layers, b.layers):
        for name in ("query", "key", "value", "beta", "skip"):
            assert torch.equal(getattr(la, name), getattr(lb, name))
    with pytest.raises(ConfigError, match="num_layers = n_components = 4"):
        EigenmapTransformer(30, 4, num_layers=2, init="lemma2")


def test_projected_representation_is_the_inner_one_on_rescaled_projected_points() -> None:
    """phi(X P) with each projected point at norm ``scale``, computed independently from the weight matrix."""
    torch.manual_seed(0)
    x = _points(b=2, n=12, d=20)
    raw = ProjectedRepresentation(RawCoordinates(), input_dim=20, dim=5, scale=0.1)
    z = x.double() @ raw.projection.weight.double().T
    expected = 0.1 * z / z.norm(dim=-1, keepdim=True)
    out = raw(x)
    assert out.shape == (2, 12, 5)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.norm(dim=-1), torch.full((2, 12), 0.1), rtol=1e-5, atol=1e-7)
    # Without a scale the projection's own output goes through unchanged.
    free = ProjectedRepresentation(RawCoordinates(), input_dim=20, dim=5, scale=None)
    torch.testing.assert_close(free(x), x @ free.projection.weight.T)


def test_projected_eigenmap_learns_its_projection_and_refuses_a_wrong_feature_dimension() -> None:
    inner = InContextEigenmap(n_points=12, n_components=3, lap_layers=1, eig_layers=1, layer_repeats=1,
                              stack_repeats=1)
    net = SemiSupervisedICL(ProjectedRepresentation(inner, input_dim=20, dim=6), GDICLHead(num_layers=1))
    assert net.n_points == 12 and net.representation.out_dim == 3
    x = _points(b=2, n=12, d=20)
    y = torch.randint(0, 2, (2, 12), generator=torch.Generator().manual_seed(1))
    labeled = torch.zeros(2, 12, dtype=torch.bool)
    labeled[:, :4] = True
    out = net(x, y, labeled)
    assert out.features.shape == (2, 12, 3) and out.logits.shape == (2, 12, 2)
    torch.nn.functional.cross_entropy(out.logits.reshape(-1, 2), y.reshape(-1)).backward()
    grad = net.representation.projection.weight.grad
    assert grad is not None and grad.abs().sum() > 0  # the projection trains through the eigenmap and the head

    class Data:
        ambient_dim = 1280

    with pytest.raises(ConfigError, match="input_dim=20 but the data's points have 1280 coordinates"):
        net.representation.check_config(datamodule=Data())
    with pytest.raises(ConfigError, match="dim"):
        ProjectedRepresentation(RawCoordinates(), input_dim=20, dim=0)


# --------------------------------------------------------------------------------------------------------
# The nets against a plain reference: the formulas of Eq. (9)-(16) and App. C as they were written before the
# nets were rewritten into fewer, larger kernels (per-head einsums, explicit distances, an index for w_{y_j}).
# Each reference reads the module's own parameters, so forward values and parameter gradients can be compared;
# it runs in the dtype of its input (float64 gives the rounding-free value).
# --------------------------------------------------------------------------------------------------------
def _ref_sq_dists(x: torch.Tensor) -> torch.Tensor:
    """``||x_i - x_j||^2`` from explicit differences (no Gram-matrix expansion)."""
    return ((x.unsqueeze(-2) - x.unsqueeze(-3)) ** 2).sum(-1)


def _ref_normalize_columns(phi: torch.Tensor) -> torch.Tensor:
    return phi / phi.norm(dim=-2, keepdim=True).clamp_min(1e-8)


def _ref_rbf_layer(layer, x: torch.Tensor, psi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (9)-(11), per head: kappa^h_ij = softmax_i(-|x_i - x_j|^2 / sigma_h^2 - |psi_i - psi_j|^2 / rho_h^2)."""
    dt = x.dtype
    n = x.shape[-2]
    inv_s2 = torch.exp(-2.0 * layer.log_sigma.to(dt))[None, :, None, None]
    inv_r2 = torch.exp(-2.0 * layer.log_rho.to(dt))[None, :, None, None]
    eye = torch.eye(n, dtype=torch.bool)
    if layer.activation == "linear":
        gram_x = (x @ x.transpose(-1, -2)).unsqueeze(1)
        gram_p = (psi @ psi.transpose(-1, -2)).unsqueeze(1)
        w = (gram_x * inv_s2 + gram_p * inv_r2) / n
        if layer.exclude_self:
            w = w.masked_fill(eye, 0.0)
    else:
        logits = -(_ref_sq_dists(x).unsqueeze(1) * inv_s2 + _ref_sq_dists(psi).unsqueeze(1) * inv_r2)
        if layer.exclude_self:
            logits = logits.masked_fill(eye, float("-inf"))
        w = torch.softmax(logits, dim=-1)
    w_lap = torch.einsum("bhji,h->bji", w, layer.value_lap.to(dt))
    psi = (1.0 + layer.skip_lap.to(dt)) * psi + w_lap @ psi
    if layer.update_coordinates:
        w_coord = torch.einsum("bhji,h->bji", w, layer.value_coord.to(dt))
        x = (1.0 + layer.skip_coord.to(dt)) * x + w_coord @ x
    return x, psi


def _ref_laplacian(lap, x: torch.Tensor) -> torch.Tensor:
    dt = x.dtype
    psi = (lap.init_base.to(dt) + lap.init_lr_scale * lap.init_delta.to(dt)).unsqueeze(0)
    for layer in lap.layers:
        x, psi = _ref_rbf_layer(layer, x, psi)
    return psi


def _ref_linear_layer(layer, phi: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """Eq. (15)-(16), head by head: Phi (I + S)^T + sum_h [beta_h G Phi A_h^T + Phi C_h^T B_h (Phi^T Phi) A_h^T]."""
    dt = phi.dtype
    k = phi.shape[-1]
    skip, beta = layer.skip.to(dt), layer.beta.to(dt)
    value, query, key = layer.value.to(dt), layer.query.to(dt), layer.key.to(dt)
    out = phi @ (torch.eye(k, dtype=dt) + skip).T
    pp = phi.transpose(-1, -2) @ phi
    for h in range(beta.shape[0]):
        out = out + beta[h] * (gram @ phi) @ value[h].T
        out = out + phi @ key[h].T @ query[h] @ pp @ value[h].T
    return _ref_normalize_columns(out)


def _ref_eigenmap(eig, psi: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    dt = psi.dtype
    gram = psi @ psi.transpose(-1, -2)
    if eig.learn_init:
        init = eig.init_base.to(dt) + eig.init_lr_scale * eig.init_delta.to(dt)
        phi = _ref_normalize_columns(init).unsqueeze(0).expand(psi.shape[0], -1, -1)
    else:
        centred = x - x.mean(-2, keepdim=True)
        cols = torch.cat([torch.ones_like(centred[..., :1]), centred, centred * centred], dim=-1)
        phi = _ref_normalize_columns(cols[..., : eig.n_components])
    for _ in range(eig.stack_repeats):
        for layer in eig.layers:
            for _ in range(eig.layer_repeats):
                phi = _ref_linear_layer(layer, phi, gram)
    return phi


def _ref_head(head, phi: torch.Tensor, y: torch.Tensor, labeled: torch.Tensor) -> torch.Tensor:
    """App. C, Eq. (25): f_{l+1}(i) = f_l(i) + alpha sum_{j labeled} [w_{y_j} - E(w | f_l(j))] kappa_ij / norm_i."""
    dt = phi.dtype
    w = head.class_embed.to(dt)
    lab = labeled.to(dt)
    if head.kernel == "linear":
        kern = phi @ phi.transpose(-1, -2)
    else:
        kern = torch.exp(-torch.exp(head.log_gamma.to(dt)) * _ref_sq_dists(phi))
    kern = kern * lab.unsqueeze(-2)
    step = torch.exp(head.log_step.to(dt))
    if head.normalize_kernel:
        kern = kern / kern.abs().sum(-1, keepdim=True).clamp_min(1e-12) * step
    else:
        kern = kern * (step / lab.sum(-1).clamp_min(1.0))[:, None, None]
    w_y = w[y.masked_fill(~labeled, 0)] * lab.unsqueeze(-1)
    f = torch.zeros_like(w_y)
    for _ in range(head.num_layers):
        if head.expectation == "mlp":
            lin1, lin2 = head.mlp[0], head.mlp[2]
            hidden = torch.nn.functional.gelu(f @ lin1.weight.to(dt).T + lin1.bias.to(dt))
            expected = hidden @ lin2.weight.to(dt).T + lin2.bias.to(dt)
        else:
            expected = torch.softmax(f @ w.T, dim=-1) @ w
        f = f + kern @ ((w_y - expected) * lab.unsqueeze(-1))
    return f @ w.T


def _ref_net(net: SemiSupervisedICL, x: torch.Tensor, y: torch.Tensor, labeled: torch.Tensor):
    rep = net.representation
    psi = _ref_laplacian(rep.laplacian, x)
    phi = _ref_eigenmap(rep.eigenmap, psi, x)
    return _ref_head(net.head, phi, y, labeled), phi


def _perturbed(net: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """Every parameter moved off its construction (zeros, identities) so that every head and path carries gradient."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return net


def _episodes(b: int, n: int, num_classes: int = 2, seed: int = 0):
    """Points on a noisy helix at the data's scale (spread ~0.05, shifted from the origin) and random labels."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(b, n, generator=gen) * 4.0
    x = 0.05 * torch.stack([t.cos(), t.sin(), 0.3 * t], -1) + 0.01 * torch.randn(b, n, 3, generator=gen)
    x = x + torch.randn(b, 1, 3, generator=gen)  # App. D's random translation
    y = torch.randint(0, num_classes, (b, n), generator=gen)
    labeled = torch.arange(n)[None] < torch.randint(2, n // 2, (b, 1), generator=gen)
    return x, y, labeled


def _value_and_grads(net: torch.nn.Module, fn) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """``fn()``'s outputs and the gradients of a fixed random projection of them w.r.t. every parameter."""
    outs = fn()
    gen = torch.Generator().manual_seed(123)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum() for o in outs)
    named = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return [o.detach() for o in outs], {
        name: (torch.zeros_like(p) if g is None else g) for (name, p), g in zip(named, grads)
    }


def _max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (0 when both vanish)."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max()
    return float((a - b).abs().max()) if scale == 0 else float((a - b).abs().max() / scale)


def _compare_to_reference(net: SemiSupervisedICL, x, y, labeled) -> dict[str, tuple[float, float]]:
    """Logits, features and every parameter gradient of ``net`` against :func:`_ref_net`.

    In float64 (``net.double()``) they must agree to 1e-10 of each tensor's largest entry: the rewrite is the same
    mathematics. In float32 (as trained) each must lie within float32 round-off of the float64 reference: 1e-4 for
    the outputs, 5e-3 for the gradients. (The formulas before the rewrite, measured the same way on these nets:
    up to 2.5e-5 on the outputs and 2.1e-3 on a gradient; the RBF bandwidths of 0.004 amplify round-off.)
    Returns ``{name: (float64 error, float32 error)}``.
    """
    net64, x64 = copy.deepcopy(net).double(), x.double()
    ours64, g_ours64 = _value_and_grads(net64, lambda: tuple(net64(x64, y, labeled)))
    ref64, g_ref64 = _value_and_grads(net64, lambda: _ref_net(net64, x64, y, labeled))
    ours32, g_ours32 = _value_and_grads(net, lambda: tuple(net(x, y, labeled)))
    assert all(o.dtype == torch.float32 for o in ours32)
    rows = [("logits", ours64[0], ref64[0], ours32[0]), ("features", ours64[1], ref64[1], ours32[1])]
    rows += [(name, g_ours64[name], g_ref64[name], g_ours32[name]) for name in g_ref64]
    errors = {}
    for name, a64, r64, a32 in rows:
        err64, err32 = _max_rel_err(a64, r64), _max_rel_err(a32, r64)
        assert err64 < 1e-10, (name, err64)
        assert err32 < (1e-4 if name in ("logits", "features") else 5e-3), (name, err32)
        errors[name] = (err64, err32)
    return errors


def test_default_net_matches_the_reference_formulas_forward_and_gradients() -> None:
    """The default ORIG+E2E-ICL net (n = 100, k = 4, 2 Laplacian layers of 4 heads, 2 x 2 x 4 eigenmap
    applications, the RBF GD head), every parameter moved off its initialisation."""
    torch.manual_seed(0)
    net = _perturbed(SemiSupervisedICL(), seed=1)
    x, y, labeled = _episodes(3, 100)
    _compare_to_reference(net, x, y, labeled)


@pytest.mark.parametrize(
    ("rep_kwargs", "head_kwargs"),
    [
        # fewer heads than components, fixed M, linear Laplacian kernel with self loops, Lemma 1's output; the
        # linear head with the exact E(w|f), unnormalised, two GD steps
        ({"n_components": 3, "eig_heads": 2, "learn_init": False, "lap_activation": "linear", "exclude_self": False,
          "lap_output": "laplacian", "lap_bandwidths": (0.5, 1.0, 2.0), "lap_layers": 3, "eig_layers": 3,
          "layer_repeats": 1, "stack_repeats": 2},
         {"num_classes": 3, "kernel": "linear", "expectation": "exact", "num_layers": 2, "normalize_kernel": False}),
        # Lemma 2's construction inside a trainable net (one head, k layers); three GD steps with the MLP
        ({"n_components": 3, "eig_layers": 3, "eig_init": "lemma2", "eig_mu": 3.0, "stack_repeats": 2},
         {"num_classes": 3, "kernel": "rbf", "num_layers": 3, "gamma": 30.0}),
        # more heads than components, one layer of each module
        ({"n_components": 2, "eig_heads": 5, "lap_layers": 1, "eig_layers": 1, "layer_repeats": 3, "stack_repeats": 1},
         {"kernel": "linear", "normalize_kernel": True, "embed_dim": 5, "mlp_hidden": 7}),
    ],
    ids=["linear-fixed-init", "lemma2", "one-layer-many-heads"],
)
def test_nondefault_nets_match_the_reference_formulas(rep_kwargs: dict, head_kwargs: dict) -> None:
    torch.manual_seed(0)
    n = 24
    net = _perturbed(SemiSupervisedICL(InContextEigenmap(n_points=n, **rep_kwargs), GDICLHead(**head_kwargs)), 2)
    x, y, labeled = _episodes(3, n, num_classes=head_kwargs.get("num_classes", 2))
    errors = _compare_to_reference(net, x, y, labeled)
    # Every parameter the net uses carries gradient here (the comparison is not of zeros).
    unused = {"head.mlp.0.weight"} | ({f"head.mlp.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
                                      if head_kwargs.get("expectation") == "exact" else set())
    grads = _value_and_grads(net, lambda: tuple(net(x, y, labeled)))[1]
    assert all(g.abs().max() > 0 for name, g in grads.items() if name not in unused), errors


def test_eigenmap_backward_passes_gradcheck() -> None:
    """The hand-written backward of the eigenmap's applications (App. A.2, Eq. 15) against finite differences, in
    float64, for every input: the features, the Gram matrix and the three stacked effective weights."""
    from lit_icl.icssl.nets.eigenmap import _effective_weights, _EigenmapIterations

    gen = torch.Generator().manual_seed(0)
    b, n, k, layers, heads = 2, 7, 3, 2, 2

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    psi = torch.randn(b, n, n, generator=gen, dtype=torch.float64) / n
    phi = rand(b, n, k)
    gram = (psi @ psi.mT).requires_grad_()
    params = [rand(layers, k, k, scale=0.3), rand(layers, heads), rand(layers, heads, k, k, scale=0.3),
              rand(layers, heads, k, k, scale=0.3), rand(layers, heads, k, k, scale=0.3)]

    def run(phi, gram, *params):
        return _EigenmapIterations.apply(phi, gram, *_effective_weights(*params), (2, 2))

    assert torch.autograd.gradcheck(run, (phi, gram, *params), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_every_parameter_gets_its_gradient_in_its_own_layout() -> None:
    """Eq. (16) uses ``S`` and ``C_h`` transposed; their gradients still arrive in the parameters' own layout, so
    autograd does not copy them after the backward (two eager ops per parameter, outside any compiled graph)."""
    torch.manual_seed(0)
    net = SemiSupervisedICL(InContextEigenmap(n_points=30, n_components=3, eig_layers=2, stack_repeats=2),
                            GDICLHead())
    x, y = _points(), torch.randint(0, 2, (3, 30))
    labeled = torch.arange(30).expand(3, 30) < 5
    arrived = {}
    for name, p in net.named_parameters():
        p.register_hook(lambda g, name=name: arrived.__setitem__(name, g.stride()))
    net(x, y, labeled).logits.square().sum().backward()
    wrong = {name: (arrived[name], p.stride()) for name, p in net.named_parameters()
             if name in arrived and arrived[name] != p.stride()}
    assert not wrong, wrong
    assert {"representation.eigenmap.layers.0.skip", "representation.eigenmap.layers.1.key"} <= set(arrived)


def test_linear_attention_layer_gradient_at_a_vanishing_column() -> None:
    """A column of zeros stays zero (its norm is clamped at 1e-8) and gets autograd's clamp gradient g / 1e-8."""
    from lit_icl.icssl.nets import LinearAttentionLayer

    torch.manual_seed(0)
    layer = _perturbed(LinearAttentionLayer(3, 2), seed=3).double()
    with torch.no_grad():  # the last column of every weight zero, so a zero last column of Phi stays zero
        layer.skip[:, -1] = layer.skip[-1] = 0
        for p in (layer.value, layer.query, layer.key):
            p[:, :, -1] = p[:, -1] = 0
    phi = torch.randn(2, 9, 3, dtype=torch.float64)
    phi[..., -1] = 0
    phi.requires_grad_()
    gram = torch.randn(2, 9, 9, dtype=torch.float64)
    gram = gram @ gram.mT
    cot = torch.randn(2, 9, 3, dtype=torch.float64)
    ours = layer(phi, gram)
    ref = _ref_linear_layer(layer, phi, gram)
    assert torch.equal(ours[..., -1], torch.zeros(2, 9, dtype=torch.float64))
    names = ["phi"] + [name for name, _ in layer.named_parameters()]
    inputs = [phi, *layer.parameters()]
    for name, a, b in zip(names, torch.autograd.grad((ours * cot).sum(), inputs),
                          torch.autograd.grad((ref * cot).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * float(b.abs().max()), msg=name)


def test_gd_head_ignores_the_labels_of_unlabeled_points_even_if_they_are_not_classes() -> None:
    """w_{y_j} is a one-hot product over the labeled points only: unlabeled points may carry any integer."""
    torch.manual_seed(0)
    head = GDICLHead(num_classes=3)
    phi, y = torch.randn(2, 20, 4), torch.randint(0, 3, (2, 20))
    labeled = torch.arange(20)[None].expand(2, 20) < 5
    garbage = torch.where(labeled, y, torch.full_like(y, -100))
    assert torch.equal(head(phi, y, labeled), head(phi, garbage, labeled))


def test_default_net_is_deterministic_and_compiles_without_graph_breaks() -> None:
    """Same seed, same bits, with deterministic algorithms on; and ``torch.compile(fullgraph=True)`` traces the
    whole net, the eigenmap's autograd Function included, with the same forward and gradients."""
    x, y, labeled = _episodes(4, 100)

    def step(compile_net: bool = False) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = SemiSupervisedICL()
        run = torch.compile(net, fullgraph=True, backend="eager") if compile_net else net
        out = run(x, y, labeled)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())
        return [out.logits.detach(), out.features.detach(), *torch.autograd.grad(loss, list(net.parameters()))]

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = step(), step()
    finally:
        torch.use_deterministic_algorithms(previous)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    torch._dynamo.reset()
    compiled = step(compile_net=True)
    for a, b in zip(compiled, first):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * max(1.0, float(b.abs().max())))


def test_bf16_autocast_keeps_the_representation_in_float32() -> None:
    """Under bf16 autocast the Laplacian, eigenmap and kernel still run in float32 (and backward works)."""
    torch.manual_seed(0)
    net = SemiSupervisedICL()
    x, y, labeled = _episodes(2, 100)
    reference = net(x, y, labeled).features
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x, y, labeled)
    assert out.features.dtype == torch.float32
    torch.testing.assert_close(out.features, reference)
    out.logits.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())

"""IC-SSL baselines of Sec. 4.1 / App. F.7 and App. G, as nets behind :class:`~lit_icl.icssl.ICSSLModule`.

=================  ==========================================================================================
paper name         net
=================  ==========================================================================================
EIG+LR             ``SemiSupervisedICL(LaplacianEigenmap(), LogisticRegressionHead())``
ORIG+RBF-LR        ``SemiSupervisedICL(RawCoordinates(), KernelLogisticRegressionHead())``
Transformer (G)    :class:`ICLTransformerBaseline`
=================  ==========================================================================================

The two logistic regressions have no trainable parameters: they are refit on every episode's ``m`` labeled
points inside ``forward``, by a batched, damped Newton method (:func:`fit_penalized_logistic`), so a test
batch of 128 episodes is 128 independent fits solved together. Evaluate them with ``test`` (``fit`` refuses
a net with nothing to train). The Transformer baseline is trained like the paper's model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.spectral import pairwise_sq_dists
from lit_icl.core.validation import check_bool, check_int, check_positive, check_range
from lit_icl.icssl.nets.model import ICSSLOutput
from lit_icl.icssl.nets.representations import check_input_dim

#: Ridge on the intercepts. The paper's LR leaves them unpenalised, but an episode whose labeled points are
#: all of one class (common at 3 % labels) then has no finite optimum; this tiny penalty keeps it finite
#: and predicts that class, and is negligible otherwise.
INTERCEPT_RIDGE = 1e-4


def penalized_logistic_objective(theta: Tensor, design: Tensor, y: Tensor, weight: Tensor, ridge: Tensor) -> Tensor:
    """Per-episode objective ``sum_i weight_i CE(softmax([0, design_i theta]), y_i) + theta^T ridge theta / 2``.

    Args:
        theta: ``(B, q, K)`` coefficients of classes ``1..K`` (class 0 is the reference with logit 0).
        design: ``(B, n, q)`` rows ``[features, 1]``.
        y: ``(B, n)`` labels in ``0..K``.
        weight: ``(B, n)`` 1 for the points that enter the fit (the labeled ones), 0 otherwise.
        ridge: ``(B, q)`` diagonal of the penalty (``lambda`` on coefficients, a tiny ridge on the intercept).
    """
    logits = F.pad(design @ theta, (1, 0))  # (B, n, K + 1)
    ce = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    return (ce * weight).sum(-1) + 0.5 * (ridge.unsqueeze(-1) * theta * theta).sum((-1, -2))


def fit_penalized_logistic(
    features: Tensor,
    y: Tensor,
    labeled: Tensor,
    num_classes: int,
    l2: float,
    max_iter: int = 50,
    tol: float = 1e-10,
) -> Tensor:
    """Multinomial logistic regression with an l2 penalty, fitted per episode by damped Newton steps.

    Minimises :func:`penalized_logistic_objective` with ``ridge = l2`` on the feature coefficients and
    :data:`INTERCEPT_RIDGE` on the intercepts. The objective is strictly convex, so the Newton direction
    ``-H^{-1} g`` with a backtracking choice among step sizes ``1, 1/2, ..., 1/128`` (the best per episode)
    converges to its unique minimiser; iterations stop when every episode's gradient norm is below ``tol``
    (times ``n``), when no step improves any episode's objective any more, or after ``max_iter``. Runs in float64: the systems are tiny (``q <= n + 1``)
    and the Hessian of a nearly separable fit is badly conditioned.

    Args:
        features: ``(B, n, p)``; rows of unlabeled points are used only for prediction.
        y: ``(B, n)`` labels in ``0..C-1`` (read where ``labeled``).
        labeled: ``(B, n)`` bool mask of the points to fit.
        num_classes: ``C``.
        l2: ``lambda`` (sklearn's ``1 / C``).

    Returns:
        ``(B, p + 1, C - 1)`` coefficients; logits of the reference class 0 are 0.
    """
    b, n, p = features.shape
    k = num_classes - 1
    design = torch.cat([features.double(), features.new_ones(b, n, 1, dtype=torch.float64)], dim=-1)
    q = p + 1
    weight = labeled.double()
    y_fit = torch.where(labeled, y, torch.zeros_like(y))
    ridge = torch.full((b, q), float(l2), dtype=torch.float64, device=features.device)
    ridge[:, -1] = INTERCEPT_RIDGE
    onehot = F.one_hot(y_fit, num_classes)[..., 1:].double()  # (B, n, K)
    theta = design.new_zeros(b, q, k)
    steps = torch.tensor([2.0**-i for i in range(8)], dtype=torch.float64, device=features.device)
    for _ in range(max_iter):
        probs = torch.softmax(F.pad(design @ theta, (1, 0)), dim=-1)[..., 1:]  # (B, n, K)
        resid = (probs - onehot) * weight.unsqueeze(-1)
        grad = design.transpose(1, 2) @ resid + ridge.unsqueeze(-1) * theta  # (B, q, K)
        if grad.flatten(1).norm(dim=-1).max() < tol * max(n, 1):
            break
        # Hessian in (class, feature) order: sum_i w_i (diag(p_i) - p_i p_i^T) kron (d_i d_i^T) + ridge.
        if k == 1:  # binary: D^T diag(w p (1 - p)) D, one batched matmul
            curv = (weight * probs[..., 0] * (1.0 - probs[..., 0])).unsqueeze(-1)
            hess = design.transpose(1, 2) @ (design * curv)
        else:
            cov = torch.diag_embed(probs) - probs.unsqueeze(-1) * probs.unsqueeze(-2)  # (B, n, K, K)
            cov = cov * weight[..., None, None]
            hess = torch.einsum("bnkl,bni,bnj->bkilj", cov, design, design).reshape(b, k * q, k * q)
        hess = hess + torch.diag_embed(ridge.repeat(1, k))
        g_flat = grad.transpose(1, 2).reshape(b, k * q)
        direction = -torch.linalg.solve(hess, g_flat).reshape(b, k, q).transpose(1, 2)
        # Damping: evaluate all step sizes at once and keep each episode's best (never worse than staying).
        trial = theta.unsqueeze(0) + steps[:, None, None, None] * direction.unsqueeze(0)  # (S, B, q, K)
        values = torch.stack([
            penalized_logistic_objective(t, design, y_fit, weight, ridge) for t in trial
        ])
        current = penalized_logistic_objective(theta, design, y_fit, weight, ridge)
        best = values.argmin(0)
        improved = values.gather(0, best.unsqueeze(0)).squeeze(0) < current
        if not improved.any():  # every episode is at its minimum to float64 precision
            break
        chosen = trial[best, torch.arange(b)]
        theta = torch.where(improved[:, None, None], chosen, theta)
    return theta


def logistic_logits(features: Tensor, theta: Tensor) -> Tensor:
    """``(B, n, C)`` logits of a fit from :func:`fit_penalized_logistic` (class 0 has logit 0)."""
    design = torch.cat([features.double(), features.new_ones(*features.shape[:2], 1, dtype=torch.float64)], -1)
    return F.pad(design @ theta, (1, 0))


def _check_lr_args(num_classes: int, l2: float, max_iter: int) -> None:
    check_int("num_classes", num_classes, minimum=2, hint="a classifier needs at least 2 classes")
    check_positive("l2", l2, hint="the l2 penalty lambda (sklearn's 1/C); e.g. 1.0")
    check_int("max_iter", max_iter, minimum=1, hint="Newton iterations; 50 is plenty")


class LogisticRegressionHead(RecordedNet):
    """EIG+LR's classifier (App. F.7): l2-regularised logistic regression refit on each episode's labels.

    ``forward(phi, y, labeled)`` has the signature of :class:`~lit_icl.icssl.nets.GDICLHead`, so it goes in
    the ``head`` slot of :class:`~lit_icl.icssl.nets.SemiSupervisedICL`. No trainable parameters.

    Args:
        num_classes: ``C``.
        l2: penalty ``lambda`` on the coefficients (objective: summed cross-entropy + ``lambda/2 ||w||^2``).
        standardize: z-score each feature over the episode's ``n`` points first (all points are available to
            a semi-supervised learner). The eigenvectors have unit norm, so their entries are about
            ``1/sqrt(n)``; without scaling, ``lambda = 1`` would shrink the coefficients to nothing and leave
            only the intercept (the labeled majority).
        max_iter: Newton iterations.
    """

    method_suffix = "LR"

    def __init__(self, num_classes: int = 2, l2: float = 1.0, standardize: bool = True, max_iter: int = 50):
        super().__init__()
        _check_lr_args(num_classes, l2, max_iter)
        check_bool("standardize", standardize)
        self.num_classes = num_classes
        self.l2 = float(l2)
        self.standardize = standardize
        self.max_iter = max_iter

    def forward(self, phi: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        feats = phi.detach().double()
        if self.standardize:
            feats = (feats - feats.mean(1, keepdim=True)) / feats.std(1, keepdim=True).clamp_min(1e-12)
        theta = fit_penalized_logistic(feats, y, labeled, self.num_classes, self.l2, self.max_iter)
        return logistic_logits(feats, theta).to(phi.dtype)


class KernelLogisticRegressionHead(RecordedNet):
    """ORIG+RBF-LR's classifier (App. F.7): kernel logistic regression with a Gaussian kernel.

    The decision function is ``sigma(sum_j alpha_j kappa(x_i, x_j) + b)`` over the labeled points ``j`` with
    ``kappa(x, x') = exp(-gamma ||x - x'||^2)`` and an l2 penalty on ``alpha`` (App. F.7), refit per episode.
    It is :class:`LogisticRegressionHead`'s solver on the features ``kappa(x_i, x_j)`` (zero for unlabeled
    ``j``, whose ``alpha_j`` the penalty then keeps at 0).

    Args:
        num_classes: ``C``.
        l2: penalty ``lambda`` on ``alpha``.
        gamma: kernel inverse bandwidth. ``None`` (default): per episode ``1 / median ||x_i - x_j||^2`` over
            all its points, which follows the random scale of App. D (a fixed gamma cannot: the scale varies
            5-fold between episodes). The paper does not state its gamma.
        max_iter: Newton iterations.
    """

    method_suffix = "RBF-LR"

    def __init__(self, num_classes: int = 2, l2: float = 1.0, gamma: float | None = None, max_iter: int = 50):
        super().__init__()
        _check_lr_args(num_classes, l2, max_iter)
        if gamma is not None:
            check_positive("gamma", gamma, hint="or null for the per-episode median heuristic")
        self.num_classes = num_classes
        self.l2 = float(l2)
        self.gamma = None if gamma is None else float(gamma)
        self.max_iter = max_iter

    def kernel(self, x: Tensor) -> Tensor:
        """``(B, n, n)`` Gaussian kernel between all points of each episode (float64)."""
        d2 = pairwise_sq_dists(x.detach().double())
        if self.gamma is not None:
            gamma = torch.full_like(d2[:, :1, :1], self.gamma)
        else:
            n = d2.shape[-1]
            off = d2.masked_select(~torch.eye(n, dtype=torch.bool, device=d2.device)).view(d2.shape[0], -1)
            gamma = (1.0 / off.median(-1).values.clamp_min(1e-30))[:, None, None]
        return torch.exp(-gamma * d2)

    def forward(self, phi: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        # Only labeled columns carry a coefficient (an unlabeled one is all zeros, its alpha stays 0), so the
        # fit runs on the columns of the labeled points: m + 1 unknowns per episode instead of n + 1.
        m_max = int(labeled.sum(-1).max())
        cols = (~labeled).to(torch.int8).argsort(dim=-1, stable=True)[:, :m_max]  # labeled indices first
        present = labeled.gather(1, cols).double()  # episodes with fewer labels pad with zero columns
        kern = self.kernel(phi)
        feats = kern.gather(2, cols.unsqueeze(1).expand(-1, kern.shape[1], -1)) * present.unsqueeze(1)
        theta = fit_penalized_logistic(feats, y, labeled, self.num_classes, self.l2, self.max_iter)
        return logistic_logits(feats, theta).to(phi.dtype)


class ICLTransformerBaseline(RecordedNet):
    """The in-context Transformer baseline of App. G (after von Oswald et al. / MetaICL).

    Each point is a token ``input_projection(x_i) + label_embedding(l_i)`` with ``l_i = y_i`` for labeled
    points and the extra ``unknown`` id ``C`` for the others; two post-LN Transformer encoder layers (4 heads,
    ``d_model = 240``, feed-forward 960) mix the tokens; a feature head ``Linear(240 -> 4)`` gives each point's
    4-dim representation (the "positional encoding" compared with EIG in Sec. 4.2) and a classification head
    ``Linear(4 -> C)`` its logits. There is no positional encoding: an episode is a set, and the net is
    permutation-equivariant. The loss (the module's) is on the unlabeled tokens only, as App. G says.

    Parameters for 3-dim inputs: 1,391,294. App. G reports 1,442,178 without listing the extra 50,884; they
    are not reproduced here (the listed layers are).

    Args:
        input_dim: ambient dimension of the points (3 for the single manifolds).
        num_classes: ``C``.
        d_model, num_heads, num_layers, dim_feedforward: encoder size (App. G: 240, 4, 2, 960).
        feature_dim: width of the feature head (App. G: 4).
        dropout: encoder dropout (0 by default: the episodes are fresh every step, nothing to overfit).
        input_norm: divide each point by its root-mean-square coordinate before the input projection (off by
            default, as App. G). For high-dimensional features stored at a small scale (the feature configs'
            ``feature_scale: 0.1``, chosen for the eigenmap's RBF bandwidths) the projected points are about
            1e-3 of the label embedding, and in our runs the loss then stayed at ln 2 for 1,500 steps; with
            ``input_norm: true`` the same run learns within 100 steps. Leave it off for 3-D manifold points,
            whose norm carries the geometry.
    """

    method = "ORIG+Transformer"
    #: Works for episodes of any size (no position-indexed parameter).
    n_points = None

    def __init__(
        self,
        input_dim: int = 3,
        num_classes: int = 2,
        d_model: int = 240,
        num_heads: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 960,
        feature_dim: int = 4,
        dropout: float = 0.0,
        input_norm: bool = False,
    ):
        super().__init__()
        check_int("input_dim", input_dim, minimum=1)
        check_int("num_classes", num_classes, minimum=2, hint="a classifier needs at least 2 classes")
        check_int("d_model", d_model, minimum=1)
        check_int("num_heads", num_heads, minimum=1)
        if d_model % num_heads:
            raise ConfigError(f"d_model={d_model} must be divisible by num_heads={num_heads} (App. G: 240 and 4)")
        check_int("num_layers", num_layers, minimum=1)
        check_int("dim_feedforward", dim_feedforward, minimum=1)
        check_int("feature_dim", feature_dim, minimum=1)
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        check_bool("input_norm", input_norm)
        self.input_dim = input_dim
        self.input_norm = input_norm
        self.num_classes = num_classes
        self.input_projection = nn.Linear(input_dim, d_model)
        self.label_embedding = nn.Embedding(num_classes + 1, d_model)  # ids 0..C-1 and `unknown` = C
        layer = nn.TransformerEncoderLayer(
            d_model, num_heads, dim_feedforward, dropout=dropout, activation="relu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.feature_head = nn.Linear(d_model, feature_dim)
        self.classification_head = nn.Linear(feature_dim, num_classes)

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the input projection must match the data's ambient dimension."""
        check_input_dim(self, datamodule, "--model.init_args.net.init_args.input_dim")

    def forward(self, x: Tensor, y: Tensor, labeled: Tensor) -> ICSSLOutput:
        ids = torch.where(labeled, y, torch.full_like(y, self.num_classes))
        if self.input_norm:  # unit RMS per point; the clamp keeps an all-zero point at zero
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).clamp_min(1e-12))
        tokens = self.input_projection(x) + self.label_embedding(ids)
        features = self.feature_head(self.encoder(tokens))
        return ICSSLOutput(self.classification_head(features), features)


def transformer_baseline_parameters(
    input_dim: int, num_classes: int, d_model: int, dim_feedforward: int, num_layers: int, feature_dim: int
) -> int:
    """Closed-form parameter count of :class:`ICLTransformerBaseline` (for the App. G comparison)."""
    attention = 4 * d_model * d_model + 4 * d_model  # in-projection (3 d^2 + 3 d) and out-projection
    feed_forward = 2 * d_model * dim_feedforward + dim_feedforward + d_model
    norms = 2 * 2 * d_model
    return (
        (input_dim + 1) * d_model
        + (num_classes + 1) * d_model
        + num_layers * (attention + feed_forward + norms)
        + (d_model + 1) * feature_dim
        + (feature_dim + 1) * num_classes
    )


__all__ = [
    "INTERCEPT_RIDGE",
    "ICLTransformerBaseline",
    "KernelLogisticRegressionHead",
    "LogisticRegressionHead",
    "fit_penalized_logistic",
    "logistic_logits",
    "penalized_logistic_objective",
    "transformer_baseline_parameters",
]

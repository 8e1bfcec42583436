"""TF_sup, IC-SSL's classifier (Sec. 3.2, App. B-C): in-context functional gradient descent on categorical labels."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lit_icl.core.nets import RecordedNet
from lit_icl.core.precision import float32_region
from lit_icl.core.validation import check_bool, check_int, check_literal, check_positive
from lit_icl.icssl.nets.laplacian import _sq_dists

#: Options with fixed choices, typed once: ``--help`` lists them and ``check_literal`` reads them from here.
Kernel = Literal["rbf", "linear"]
Expectation = Literal["mlp", "exact"]


# --------------------------------------------------------------------------------------------------------
# TF_sup: the categorical functional-GD ICL head (Sec. 3.2, App. B-C)
# --------------------------------------------------------------------------------------------------------
class GDICLHead(RecordedNet):
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
        check_bool("normalize_kernel", normalize_kernel)
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

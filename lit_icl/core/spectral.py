"""Batched graph-Laplacian tools shared by papers that look at manifold structure.

Everything here runs in float32 with autocast disabled: distance matrices, graph weights and eigen-solvers
are the numerically delicate parts of a forward pass and lose their meaning in bf16.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lit_icl.core.errors import ConfigError
from lit_icl.core.precision import float32_region

LaplacianNorm = Literal["sym", "unnormalized"]


def pairwise_sq_dists(x: Tensor) -> Tensor:
    """Squared Euclidean distances between the points of each set.

    Args:
        x: ``(..., n, d)`` points.

    Returns:
        ``(..., n, n)`` float32 matrix with ``D[..., i, j] = ||x_i - x_j||^2``, clamped at 0 so round-off
        never produces a negative distance.
    """
    # Centre each set first: the expansion below cancels catastrophically when the points sit far from the
    # origin relative to their spread (App. D translates by up to 1 and scales by 0.02).
    x = x.float()
    x = x - x.mean(dim=-2, keepdim=True)
    sq = (x * x).sum(-1)
    d2 = sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * (x @ x.transpose(-1, -2))
    return d2.clamp_min_(0.0)


@float32_region
def knn_rbf_adjacency(x: Tensor, n_neighbors: int = 6, rbf_scale: float = 10.0) -> Tensor:
    """Symmetric k-nearest-neighbour graph with RBF weights (IC-SSL App. D).

    ``A_ij = exp(-rbf_scale * ||x_i - x_j||^2)`` if ``j`` is among the ``n_neighbors`` nearest neighbours of
    ``i`` or vice versa, else 0; no self loops. The paper's code writes this as
    ``A_rbf = torch.exp(-scale_rbf * dist_sq)`` with ``scale_rbf = 10`` and ``k = 6``.

    Args:
        x: ``(B, n, d)`` points.
        n_neighbors: neighbours per point, ``1 <= n_neighbors <= n - 1``.
        rbf_scale: inverse squared bandwidth of the RBF weights.

    Returns:
        ``(B, n, n)`` float32 symmetric adjacency matrix.
    """
    n = x.shape[-2]
    if not 1 <= n_neighbors <= n - 1:
        raise ConfigError(
            f"n_neighbors={n_neighbors} but an episode has only {n} points; choose 1 <= n_neighbors <= {n - 1}"
        )
    d2 = pairwise_sq_dists(x)
    eye = torch.eye(n, dtype=torch.bool, device=x.device)
    # Exclude self before picking neighbours; a point is never its own neighbour.
    idx = d2.masked_fill(eye, float("inf")).topk(n_neighbors, dim=-1, largest=False).indices
    mask = torch.zeros_like(d2, dtype=torch.bool).scatter_(-1, idx, True)
    mask = mask | mask.transpose(-1, -2)
    return torch.where(mask, torch.exp(-rbf_scale * d2), torch.zeros_like(d2))


def graph_laplacian(adjacency: Tensor, normalization: LaplacianNorm = "sym") -> Tensor:
    """``L = D - A`` or the symmetric normalisation ``I - D^{-1/2} A D^{-1/2}`` (IC-SSL Eq. 14).

    Isolated nodes (degree 0) get a zero row/column in ``D^{-1/2}``, so they do not produce NaN.
    """
    deg = adjacency.sum(-1)
    if normalization == "unnormalized":
        return torch.diag_embed(deg) - adjacency
    if normalization == "sym":
        inv_sqrt = torch.where(deg > 0, deg.clamp_min(1e-12).rsqrt(), torch.zeros_like(deg))
        n = adjacency.shape[-1]
        eye = torch.eye(n, dtype=adjacency.dtype, device=adjacency.device)
        return eye - inv_sqrt.unsqueeze(-1) * adjacency * inv_sqrt.unsqueeze(-2)
    raise ConfigError(f"unknown Laplacian normalization {normalization!r}; choose 'sym' or 'unnormalized'")


@float32_region
def laplacian_eigenmap(
    x: Tensor,
    n_components: int = 4,
    n_neighbors: int = 6,
    rbf_scale: float = 10.0,
    normalization: LaplacianNorm = "sym",
) -> Tensor:
    """Laplacian eigenmap: the bottom ``n_components`` eigenvectors of the kNN-RBF graph Laplacian.

    This is the "ground-truth" EIG representation of IC-SSL Sec. 4.1 and App. D (k = 6 neighbours,
    RBF scale 10, 4 eigenvectors, the trivial one included as in the paper's "first 4 corresponding to the
    smallest eigenvalues"). Eigenvectors are only defined up to sign (and rotation inside degenerate
    eigenspaces); an RBF kernel on the rows is invariant to both.

    Returns:
        ``(B, n, n_components)``: row ``i`` is the embedding of point ``i``; columns have unit norm.
    """
    n = x.shape[-2]
    if not 1 <= n_components <= n:
        raise ConfigError(f"n_components={n_components} must lie in [1, {n}] for episodes of {n} points")
    lap = graph_laplacian(knn_rbf_adjacency(x, n_neighbors, rbf_scale), normalization)
    # eigh returns ascending eigenvalues; the Laplacian is symmetric by construction.
    _, vecs = torch.linalg.eigh(lap)
    return vecs[..., :n_components]

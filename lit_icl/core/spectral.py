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
    # Ascending eigenvalues; the Laplacian is symmetric by construction.
    return symmetric_eigenvectors(lap)[..., :n_components]


#: The largest matrix torch's CUDA ``eigh`` solves as one batched call (cuSOLVER's batched Jacobi solver); for
#: larger matrices it calls a single-matrix solver once per matrix of the batch.
CUDA_BATCHED_EIGH_MAX_N = 32


def eigh_on_host(shape: torch.Size | tuple[int, ...], device: torch.device) -> bool:
    """Whether :func:`symmetric_eigenvectors` solves matrices of ``shape`` on ``device`` on the host instead.

    True for a CUDA batch of more than one matrix larger than :data:`CUDA_BATCHED_EIGH_MAX_N`: there torch runs
    one solver call per matrix. pytorch/pytorch issue 174674 reports 914 ms for 500 matrices of 100 x 100 on a
    GPU (CuPy's batched solver: 8 ms), and issue 175585 the cliff from n = 33 on. LAPACK on the host solves
    IC-SSL's batch of 64 such matrices in 26 ms on our 2-core CPU machine. ``benchmarks/eigh_route.py`` times
    both routes on a GPU.
    """
    batch = 1
    for size in shape[:-2]:
        batch *= size
    return device.type == "cuda" and batch > 1 and shape[-1] > CUDA_BATCHED_EIGH_MAX_N


def symmetric_eigenvectors(matrices: Tensor) -> Tensor:
    """Eigenvectors of a batch of symmetric matrices, columns in ascending order of eigenvalue.

    ``torch.linalg.eigh(matrices).eigenvectors``, solved where it is fast (:func:`eigh_on_host`): a CUDA
    batch of matrices larger than 32 x 32 goes to the host and its eigenvectors come back to the device. On the
    CPU this is ``torch.linalg.eigh`` itself, so CPU numbers do not change; on a GPU the host route gives the
    CPU's LAPACK result. The copy waits for the device, which a per-matrix solver loop does as well.

    Args:
        matrices: ``(..., n, n)`` symmetric matrices.

    Returns:
        ``(..., n, n)`` eigenvectors on the device of ``matrices``.
    """
    if eigh_on_host(matrices.shape, matrices.device):
        return torch.linalg.eigh(matrices.cpu()).eigenvectors.to(matrices.device)
    return torch.linalg.eigh(matrices).eigenvectors

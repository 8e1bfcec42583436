"""Representation metrics as pure functions: separation score and k-NN alignment scores.

Definitions:

* **Separation score** (IC-SSL, App. F.5, Remark 5): class-averaged mean intra-class cosine similarity minus
  the mean inter-class cosine similarity,

      Sep = (1/|C|) sum_{c in C} E_{x_i, x_j in c, i != j}[cos(x_i, x_j)]
            - E_{x in c, y in c', c != c'}[cos(x, y)].

* **k-NN alignment** between two embeddings ``A`` and ``B`` of the *same* samples, following
  ``minyoungg/platonic-rep`` ``metrics.py`` (Huh et al. 2024), which IC-SSL Table 1 cites for mNN, Cycle and
  LCS: ``mutual_knn``, ``cycle_knn`` and ``lcs_knn`` (the last one divided by ``k``, see :func:`lcs_knn`).

Shapes: every function accepts one set ``(N, D)`` (labels ``(N,)``) and returns a 0-d tensor, or ``B``
independent sets ``(B, N, D)`` (episodes; labels ``(B, N)``) and returns ``(B,)`` per-set scores. Nothing is
ever compared across sets. All arithmetic runs in float32 with autocast off, whatever the input dtype: cosine
similarities and neighbour rankings are exactly the numerically delicate parts that bf16 would change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_icl.core.errors import ConfigError

__all__ = [
    "cycle_knn",
    "knn_indices",
    "lcs_knn",
    "longest_common_subsequence",
    "mutual_knn",
    "separation_score",
    "validate_k",
]

# Row block for the similarity matrix in ``knn_indices``: bounds the transient (block, N) float32 buffer, so a
# pooled set of tens of thousands of points does not need an N x N matrix at once.
_KNN_ROW_BLOCK = 4096
# F.normalize's eps: a zero vector stays a zero vector (cosine 0 to everything) instead of becoming NaN.
_NORM_EPS = 1e-12


def validate_k(k: int) -> int:
    """Check a neighbour count given at construction time; return it as an ``int``.

    Raises:
        ConfigError: (a ``ValueError``) if ``k`` is not an integer ``>= 1``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k={k!r} neighbours requested; k must be an integer >= 1")
    return k


def _as_sets(x: Tensor, name: str) -> tuple[Tensor, bool]:
    """View ``(N, D)`` or ``(B, N, D)`` as ``(B, N, D)`` float32; also say whether the input was batched."""
    if x.ndim == 2:
        return x.float().unsqueeze(0), False
    if x.ndim == 3:
        return x.float(), True
    raise ValueError(f"{name} must have shape (N, D) or (B, N, D), got {tuple(x.shape)}")


def _unit_rows(x: Tensor) -> Tensor:
    return F.normalize(x, p=2.0, dim=-1, eps=_NORM_EPS)


def _check_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, bool]:
    """Common checks for the alignment scores: A and B embed the same samples (dims may differ)."""
    a3, batched = _as_sets(a, "A")
    b3, batched_b = _as_sets(b, "B")
    if batched != batched_b or a3.shape[:2] != b3.shape[:2]:
        raise ValueError(
            f"A and B must embed the same samples: got shapes {tuple(a.shape)} and {tuple(b.shape)} "
            "(leading (N,) or (B, N) must match; only the feature dimension may differ)"
        )
    return a3, b3, batched


def _k_fits(k: int, n: int) -> None:
    validate_k(k)
    if k >= n:
        raise ConfigError(
            f"k={k} neighbours requested but a set has only {n} points; choose k <= {n - 1}"
        )


def _neighbour_pair(a3: Tensor, b3: Tensor, batched: bool, k: int,
                    neighbours: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """The ``(B, N, k)`` neighbour lists of ``A`` and ``B`` (sets already checked by :func:`_check_pair`).

    ``neighbours``, when given, are :func:`knn_indices` of the same ``a`` and ``b`` with the same ``k``, computed
    once by a caller that scores several alignments of one pair (:class:`~lit_icl.callbacks.RepresentationMetrics`
    scores three): the scores then equal those computed from the embeddings, bit for bit, with a third of the
    top-k searches. Only their shapes can be checked here.
    """
    if neighbours is None:
        return knn_indices(a3, k), knn_indices(b3, k)
    _k_fits(k, a3.shape[1])
    lists = []
    for name, idx, sets in (("A", neighbours[0], a3), ("B", neighbours[1], b3)):
        want = (*sets.shape[:2], k) if batched else (sets.shape[1], k)
        if tuple(idx.shape) != want or idx.dtype != torch.long:
            raise ValueError(
                f"neighbours of {name} must be knn_indices of the same embedding with k={k}: int64 of shape "
                f"{want}, got {idx.dtype} of shape {tuple(idx.shape)}"
            )
        lists.append(idx if batched else idx.unsqueeze(0))
    return lists[0], lists[1]


@torch.autocast("cuda", enabled=False)
@torch.autocast("cpu", enabled=False)
def separation_score(emb: Tensor, labels: Tensor) -> Tensor:
    """Separation score of IC-SSL (App. F.5, Remark 5): mean intra- minus mean inter-class cosine similarity.

    ``Sep = (1/|C|) sum_c mean_{i != j in c} cos(x_i, x_j) - mean_{x in c, y in c', c != c'} cos(x, y)``

    * The intra term is **class-averaged** (each class weighs the same, as in Remark 5) and excludes self
      pairs; classes with fewer than 2 points have no pair and are left out of that average.
    * The inter term is **pair-weighted**: one mean over all pairs of points with different labels.
    * Returns NaN for a set whose score is undefined: only one class (no inter-class pair), or no class with
      two points (no intra-class pair). :class:`~lit_icl.metrics.SeparationScore` skips such sets.
    * Embeddings are L2-normalised in float32, so the score is invariant to rescaling each vector by a
      positive constant; a zero vector stays zero (cosine 0 with every point) rather than producing NaN.

    Computed from per-class sums of unit vectors instead of an N x N Gram matrix: for a class with unit-vector
    sum ``S_c`` the ordered intra-class pairs sum to ``||S_c||^2 - sum_{i in c} ||x_i||^2`` and all
    inter-class pairs to ``||sum_c S_c||^2 - sum_c ||S_c||^2``. Memory and time are O(N D), so a pooled set of
    thousands of points is as cheap as an episode.

    Args:
        emb: ``(N, D)`` or ``(B, N, D)`` embeddings.
        labels: ``(N,)`` or ``(B, N)`` class ids (any sortable dtype; only equality matters). Ids are compared
            only within a set.

    Returns:
        float32 score, 0-d for one set or ``(B,)`` for ``B`` sets.
    """
    x, batched = _as_sets(emb, "emb")
    lab = labels.unsqueeze(0) if labels.ndim == 1 else labels
    if labels.ndim != emb.ndim - 1 or lab.shape != x.shape[:2]:
        raise ValueError(
            f"labels must have shape (N,) for emb (N, D) or (B, N) for emb (B, N, D); "
            f"got labels {tuple(labels.shape)} and emb {tuple(emb.shape)}"
        )
    n_sets, n, d = x.shape
    x = _unit_rows(x)

    # Relabel every set to dense ids 0..C_set-1 (sort, mark changes, cumsum): the per-class buffers are then
    # at most (B, N, D), whatever the label values, and no class is shared across sets.
    sorted_lab, order = lab.sort(dim=-1)
    starts = torch.ones_like(sorted_lab, dtype=torch.long)
    starts[:, 1:] = (sorted_lab[:, 1:] != sorted_lab[:, :-1]).long()
    ids = torch.empty_like(starts).scatter_(-1, order, starts.cumsum(-1) - 1)

    class_sum = x.new_zeros(n_sets, n, d).scatter_add_(1, ids.unsqueeze(-1).expand(-1, -1, d), x)
    class_n = x.new_zeros(n_sets, n).scatter_add_(1, ids, torch.ones_like(x[..., 0]))
    # Actual squared norms (1, or 0 for a zero vector) rather than the count, so zero vectors are exact.
    class_sq = x.new_zeros(n_sets, n).scatter_add_(1, ids, (x * x).sum(-1))

    class_sum_sq = (class_sum * class_sum).sum(-1)  # ||S_c||^2
    intra_pairs = class_n * (class_n - 1.0)
    has_pairs = intra_pairs > 0
    intra_mean = (class_sum_sq - class_sq) / intra_pairs.clamp_min(1.0)
    n_valid = has_pairs.sum(-1)
    intra = torch.where(has_pairs, intra_mean, 0.0).sum(-1) / n_valid.clamp_min(1)

    total = class_sum.sum(1)
    inter_sum = (total * total).sum(-1) - class_sum_sq.sum(-1)
    inter_pairs = float(n * n) - (class_n * class_n).sum(-1)
    inter = inter_sum / inter_pairs.clamp_min(1.0)

    score = torch.where((n_valid > 0) & (inter_pairs > 0), intra - inter, float("nan"))
    return score if batched else score[0]


@torch.autocast("cuda", enabled=False)
@torch.autocast("cpu", enabled=False)
def knn_indices(feats: Tensor, k: int) -> Tensor:
    """Indices of each point's ``k`` nearest neighbours by cosine similarity, self excluded.

    Like platonic-rep's ``compute_nearest_neighbors`` applied to features its caller has L2-normalised: the
    similarity matrix has its diagonal masked (to -inf here) so a point is never its own neighbour, and each
    row keeps its top ``k``, ordered from most to least similar. Ties are broken arbitrarily (as in
    platonic-rep), which only matters for duplicated or degenerate embeddings.

    Args:
        feats: ``(N, D)`` or ``(B, N, D)``.
        k: neighbours per point, ``1 <= k <= N - 1``.

    Returns:
        int64 indices ``(N, k)`` or ``(B, N, k)`` into the point axis of the same set.

    Raises:
        ConfigError: (a ``ValueError``) if ``k < 1`` or ``k >= N``.
    """
    x, batched = _as_sets(feats, "feats")
    n = x.shape[1]
    _k_fits(k, n)
    x = _unit_rows(x)
    xt = x.transpose(1, 2)
    blocks = []
    for start in range(0, n, _KNN_ROW_BLOCK):
        stop = min(start + _KNN_ROW_BLOCK, n)
        sim = x[:, start:stop] @ xt  # (B, rows, N)
        rows = torch.arange(stop - start, device=x.device)
        sim[:, rows, rows + start] = float("-inf")
        blocks.append(sim.topk(k, dim=-1, largest=True, sorted=True).indices)
    idx = torch.cat(blocks, dim=1)
    return idx if batched else idx[0]


def longest_common_subsequence(a: Tensor, b: Tensor) -> Tensor:
    """Length of the longest common subsequence of each pair of rows of ``a`` and ``b``.

    Vectorised over all rows: the classic DP ``L[i][j] = L[i-1][j-1] + 1 if a_i == b_j else
    max(L[i-1][j], L[i][j-1])`` is rewritten row by row as ``L[i][:] = cummax_j(max(L[i-1][j],
    L[i-1][j-1] + [a_i == b_j]))``, which is equivalent because an LCS table grows by at most 1 per step and
    ``L[i][j-1]`` is exactly the running maximum along ``j``. So the loop runs over the ``k`` positions of
    ``a`` only, never over rows.

    Args:
        a: ``(..., La)`` sequences (any dtype with equality).
        b: ``(..., Lb)`` sequences with the same leading shape.

    Returns:
        int64 LCS lengths with the leading shape.
    """
    if a.shape[:-1] != b.shape[:-1]:
        raise ValueError(f"a and b need the same leading shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])
    b2 = b.reshape(-1, b.shape[-1])
    m, lb = b2.shape
    prev = torch.zeros(m, lb + 1, dtype=torch.long, device=a.device)  # L[i-1][0..Lb]
    for i in range(a2.shape[1]):
        match = (a2[:, i : i + 1] == b2).long()  # (M, Lb): a_i == b_j
        cand = torch.maximum(prev[:, 1:], prev[:, :-1] + match)
        row = torch.zeros_like(prev)
        row[:, 1:] = cand.cummax(dim=-1).values
        prev = row
    return prev[:, -1].reshape(lead)


@torch.autocast("cuda", enabled=False)
@torch.autocast("cpu", enabled=False)
def mutual_knn(a: Tensor, b: Tensor, k: int, neighbours: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Mutual k-NN alignment (platonic-rep ``mutual_knn``): ``(1/N) sum_i |N_A(i) ∩ N_B(i)| / k``.

    Symmetric in ``A`` and ``B``; in [0, 1]; chance level about ``k / (N - 1)``.

    Args:
        a: ``(N, Da)`` or ``(B, N, Da)`` first embedding of the samples.
        b: ``(N, Db)`` or ``(B, N, Db)`` second embedding of the same samples.
        k: neighbours per point, ``1 <= k <= N - 1``.
        neighbours: optional ``(knn_indices(a, k), knn_indices(b, k))``, computed once for several scores.

    Returns:
        float32 score, 0-d or ``(B,)``.
    """
    a3, b3, batched = _check_pair(a, b)
    na, nb = _neighbour_pair(a3, b3, batched, k, neighbours)
    # Neighbour lists hold distinct indices, so counting equal (p, q) entries counts the intersection.
    overlap = (na.unsqueeze(-1) == nb.unsqueeze(-2)).sum(dim=(-1, -2))  # (B, N)
    score = overlap.float().div(k).mean(-1)
    return score if batched else score[0]


@torch.autocast("cuda", enabled=False)
@torch.autocast("cpu", enabled=False)
def cycle_knn(a: Tensor, b: Tensor, k: int, neighbours: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Cycle k-NN alignment (platonic-rep ``cycle_knn``): ``(1/N) sum_i 1[i in ∪_{j in N_B(i)} N_A(j)]``.

    **Argument order matters** (the score is asymmetric), and matches platonic-rep's ``cycle_knn(feats_A,
    feats_B)``: from sample ``i`` go to its ``k`` neighbours in **B**, then to each of those points' ``k``
    neighbours in **A** (``knn_A[knn_B]``), and count whether ``i`` comes back. In [0, 1].

    Args:
        a: ``(N, Da)`` or ``(B, N, Da)`` embedding used for the second hop.
        b: ``(N, Db)`` or ``(B, N, Db)`` embedding used for the first hop.
        k: neighbours per point, ``1 <= k <= N - 1``.
        neighbours: optional ``(knn_indices(a, k), knn_indices(b, k))``, computed once for several scores.

    Returns:
        float32 score, 0-d or ``(B,)``.
    """
    a3, b3, batched = _check_pair(a, b)
    na, nb = _neighbour_pair(a3, b3, batched, k, neighbours)
    n_sets, n, _ = na.shape
    # two_hop[s, i, m, :] = N_A(N_B(i)[m]) within set s.
    two_hop = torch.gather(na, 1, nb.reshape(n_sets, n * k, 1).expand(-1, -1, k)).view(n_sets, n, k, k)
    self_idx = torch.arange(n, device=na.device).view(1, n, 1, 1)
    score = (two_hop == self_idx).flatten(2).any(-1).float().mean(-1)
    return score if batched else score[0]


@torch.autocast("cuda", enabled=False)
@torch.autocast("cpu", enabled=False)
def lcs_knn(a: Tensor, b: Tensor, k: int, neighbours: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """LCS k-NN alignment, **normalised by k**: ``(1/N) sum_i LCS(N_A(i), N_B(i)) / k``.

    ``N_A(i)`` and ``N_B(i)`` are the rank-ordered neighbour lists (most similar first), and LCS is the
    length of their longest common subsequence, so the score rewards neighbours shared *in the same order*.
    It is symmetric and lies in [0, 1], and never exceeds :func:`mutual_knn` on the same inputs.

    platonic-rep's ``lcs_knn`` returns the mean LCS length **without** dividing by ``k`` (range 0..k). IC-SSL
    Table 1 reports LCS 0.19 next to mNN 0.30, which is only possible in [0, 1] units, so its code must have
    divided by ``k``; we do the same so the three alignment scores share one scale.

    Args:
        a: ``(N, Da)`` or ``(B, N, Da)`` first embedding of the samples.
        b: ``(N, Db)`` or ``(B, N, Db)`` second embedding of the same samples.
        k: neighbours per point, ``1 <= k <= N - 1``.
        neighbours: optional ``(knn_indices(a, k), knn_indices(b, k))``, computed once for several scores.

    Returns:
        float32 score, 0-d or ``(B,)``.
    """
    a3, b3, batched = _check_pair(a, b)
    na, nb = _neighbour_pair(a3, b3, batched, k, neighbours)
    score = longest_common_subsequence(na, nb).float().div(k).mean(-1)
    return score if batched else score[0]

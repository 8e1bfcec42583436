"""Stateful torchmetrics wrappers around :mod:`lit_icl.metrics.functional`.

Each metric scores every *set* (one ``(N, D)`` tensor, or each episode of a ``(B, N, D)`` batch) on its own
with the functional definition, and reports the mean over sets. Only two scalar states are kept, ``total``
(sum of per-set scores) and ``count`` (number of sets that had a defined score), both reduced with ``"sum"``;
so the result is exact under DDP however the sets are split across ranks (unequal counts included), and no
embedding is ever gathered. Sets whose score is NaN (e.g. a separation score on a set with a single class)
are left out of the mean and counted in ``skipped`` instead, so they neither poison nor bias the average.

Use ``update`` + ``compute`` (``forward`` also works and returns the batch's mean over sets). ``compute`` is a
collective under DDP: call it on every rank. With no scored set it returns NaN rather than raising.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_icl.metrics.functional import (
    cycle_knn,
    lcs_knn,
    mutual_knn,
    separation_score,
    validate_k,
)

__all__ = ["LCSKNN", "CycleKNN", "MutualKNN", "SeparationScore"]


class _MeanOverSets(Metric):
    """Mean of a per-set score over all sets seen since the last reset (NaN scores are skipped)."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    total: Tensor
    count: Tensor
    skipped: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # float32 (not float64) so the metric can live on any accelerator, MPS included.
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("skipped", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    @staticmethod
    def _drops_by_mask(device: torch.device) -> bool:
        """Whether NaN scores on ``device`` are dropped with a boolean mask before summing. On a CPU it costs
        nothing and keeps the sums of earlier runs; on an accelerator the mask's output size would be read back
        (a device sync per update), so NaN scores add 0 there instead: the same mean, which may differ in the last
        bit when a set is undefined, since the zeros change the summation order."""
        return device.type == "cpu"

    def _accumulate(self, scores: Tensor) -> None:
        scores = scores.reshape(-1)
        valid = ~torch.isnan(scores)
        kept = scores[valid] if self._drops_by_mask(scores.device) else torch.where(valid, scores, 0.0)
        self.total += kept.sum().to(self.total)
        n_valid = valid.sum()
        self.count += n_valid
        self.skipped += scores.numel() - n_valid

    def compute(self) -> Tensor:
        """Mean per-set score; NaN if no set had a defined score (computed on the device, nothing read back)."""
        return torch.where(self.count > 0, self.total / self.count.clamp_min(1), float("nan"))


class SeparationScore(_MeanOverSets):
    """Separation score of IC-SSL (App. F.5, Remark 5), averaged over sets.

    Per set: class-averaged mean intra-class cosine similarity (self pairs excluded) minus the mean
    inter-class cosine similarity; see :func:`lit_icl.metrics.functional.separation_score`. Sets with a
    single class (or no class with two points) have no defined score: they are counted in ``skipped`` and
    left out of the mean.
    """

    plot_lower_bound = -2.0
    plot_upper_bound = 2.0

    def update(self, emb: Tensor, labels: Tensor) -> None:
        """Score one set ``emb (N, D), labels (N,)`` or ``B`` sets ``emb (B, N, D), labels (B, N)``."""
        self._accumulate(separation_score(emb.detach().float(), labels.detach()))


class _KNNAlignment(_MeanOverSets):
    """Shared constructor and ``update`` for the k-NN alignment scores (all in [0, 1])."""

    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    # Set by each subclass to the functional score (a staticmethod), so update() stays in one place.
    _score: Callable[..., Tensor]

    def __init__(self, k: int = 10, **kwargs: Any) -> None:
        # Fail at construction (a config error) rather than at the first validation batch.
        k = validate_k(k)
        super().__init__(**kwargs)
        self.k = k

    def update(self, a: Tensor, b: Tensor, neighbours: tuple[Tensor, Tensor] | None = None) -> None:
        """Score the pair of embeddings ``a``, ``b`` of the same samples: ``(N, D*)`` or ``(B, N, D*)``.

        ``neighbours``: optionally their :func:`~lit_icl.metrics.functional.knn_indices` with this metric's ``k``,
        when the caller scores several alignments of the same pair (the top-k search is most of a score's cost).

        Raises:
            ValueError: if a set has ``N <= k`` points, or ``neighbours`` do not have the lists' shape.
        """
        self._accumulate(self._score(a.detach().float(), b.detach().float(), self.k, neighbours))


class MutualKNN(_KNNAlignment):
    """Mutual k-NN alignment (platonic-rep; IC-SSL Table 1 "mNN"), averaged over sets.

    See :func:`lit_icl.metrics.functional.mutual_knn`. Neighbours are computed within each set, so for
    episodic inputs this is the per-episode alignment; pass one ``(N, D)`` set to score a pooled dataset.
    """

    _score = staticmethod(mutual_knn)


class CycleKNN(_KNNAlignment):
    """Cycle k-NN alignment (platonic-rep; IC-SSL Table 1 "Cycle"), averaged over sets.

    Asymmetric: ``update(a, b)`` takes the first hop in ``b`` and the second in ``a``, as platonic-rep's
    ``cycle_knn(feats_A, feats_B)``; see :func:`lit_icl.metrics.functional.cycle_knn`.
    """

    _score = staticmethod(cycle_knn)


class LCSKNN(_KNNAlignment):
    """LCS k-NN alignment divided by ``k`` (IC-SSL Table 1 "LCS"), averaged over sets.

    See :func:`lit_icl.metrics.functional.lcs_knn` for why the score is normalised by ``k``, unlike
    platonic-rep.
    """

    _score = staticmethod(lcs_knn)

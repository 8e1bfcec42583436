"""Representation metrics: separation score (IC-SSL App. F.5) and k-NN alignment scores (platonic-rep).

The math lives in :mod:`lit_icl.metrics.functional`; the classes here are thin torchmetrics wrappers that
average per-set scores and sync exactly under DDP.
"""

from lit_icl.metrics.functional import (
    cycle_knn,
    knn_indices,
    lcs_knn,
    longest_common_subsequence,
    mutual_knn,
    separation_score,
)
from lit_icl.metrics.representation import LCSKNN, CycleKNN, MutualKNN, SeparationScore

__all__ = [
    "LCSKNN",
    "CycleKNN",
    "MutualKNN",
    "SeparationScore",
    "cycle_knn",
    "knn_indices",
    "lcs_knn",
    "longest_common_subsequence",
    "mutual_knn",
    "separation_score",
]

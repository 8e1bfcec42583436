"""Lightning callbacks: metrics from :mod:`lit_icl.metrics` logged during a run, and the guard every CLI run
gets against non-finite losses and weights (:class:`FiniteGuard`)."""

from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.callbacks.representation import RepresentationMetrics

__all__ = ["FiniteGuard", "RepresentationMetrics"]

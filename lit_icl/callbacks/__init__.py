"""Lightning callbacks: metrics from :mod:`lit_icl.metrics` logged during a run, the guard every CLI run
gets against non-finite losses and weights (:class:`FiniteGuard`), and the CLI's checkpoint callback, which
survives a moved run folder (:class:`RunCheckpoint`)."""

from lit_icl.callbacks.checkpoint import RunCheckpoint
from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.callbacks.representation import RepresentationMetrics

__all__ = ["FiniteGuard", "RepresentationMetrics", "RunCheckpoint"]

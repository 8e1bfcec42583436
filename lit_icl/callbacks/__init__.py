"""Lightning callbacks that feed :mod:`lit_icl.metrics` and log their values."""

from lit_icl.callbacks.representation import RepresentationMetrics

__all__ = ["RepresentationMetrics"]

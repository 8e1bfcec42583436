"""IC-SSL's net: :class:`SemiSupervisedICL`, a representation of all points followed by a classifier."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from lit_icl.core.nets import RecordedNet
from lit_icl.icssl.nets.heads import GDICLHead
from lit_icl.icssl.nets.representations import InContextEigenmap


class ICSSLOutput(NamedTuple):
    """What an IC-SSL net returns: class logits for every token and the representation it classified."""

    logits: Tensor  # (B, n, C)
    features: Tensor  # (B, n, k)


class SemiSupervisedICL(RecordedNet):
    """``[Data + Model]`` of Sec. 4.1: a representation ``phi(X)`` of all points, then the GD ICL head.

    Args:
        representation: :class:`InContextEigenmap` (ORIG+E2E-ICL, the default), :class:`LaplacianEigenmap`
            (EIG+ICL) or :class:`RawCoordinates` (ORIG+ICL); any module mapping ``(B, n, d)`` to ``(B, n, k)``.
        head: the classifier; defaults to :class:`GDICLHead` with the paper's one RBF layer.
    """

    def __init__(self, representation: nn.Module | None = None, head: nn.Module | None = None):
        super().__init__()
        self.representation = representation if representation is not None else InContextEigenmap()
        self.head = head if head is not None else GDICLHead()

    @property
    def num_classes(self) -> int:
        """``C``, from the head (2 if the head does not say)."""
        return int(getattr(self.head, "num_classes", 2))

    @property
    def n_points(self) -> int | None:
        """The episode size the representation was built for, or None if it works for any size."""
        return getattr(self.representation, "n_points", None)

    def represent(self, x: Tensor) -> Tensor:
        """``phi(X)``: ``(B, n, d)`` -> ``(B, n, k)``; it never sees labels, so it can be reused across ratios."""
        return self.representation(x)

    def classify(self, features: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """Logits ``(B, n, C)`` from features and the labeled subset."""
        return self.head(features, y, labeled)

    def forward(self, x: Tensor, y: Tensor, labeled: Tensor) -> ICSSLOutput:
        features = self.represent(x)
        return ICSSLOutput(self.classify(features, y, labeled), features)

"""What :class:`~lit_icl.icssl.ICSSLModule` needs of its data module and of its net, written as Protocols.

A new data module or net works with the module when it satisfies these (:func:`~lit_icl.core.protocols.implements`
checks them at run time: member names and each method's argument names, so the docstrings say what the values
mean). The shipped ones
(:class:`~lit_icl.icssl.ManifoldDataModule`, ``ImageManifoldDataModule``, ``FeatureEpisodeDataModule``;
:class:`~lit_icl.icssl.SemiSupervisedICL`, :class:`~lit_icl.icssl.ICLTransformerBaseline`) are checked by
``tests/icssl/test_contracts.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor, nn

if TYPE_CHECKING:
    from lit_icl.icssl.nets import ICSSLOutput


@runtime_checkable
class ICSSLDataModule(Protocol):
    """What ``ICSSLModule.bind_datamodule`` reads from the data module.

    Attributes:
        n_points: points per episode ``n`` (the label ratios are turned into counts ``round(ratio * n)``).
        eval_label_ratios: the label ratios swept in validation and test.
        labeled_subset: which ``m`` points are labeled: ``"random"`` (the first ``m``) or ``"stratified"``.
        test_set_names: names of separate test sets, one test dataloader each (e.g. one per test manifold),
            which tag the test rows; ``None`` for a single test set.
        train_episodes: size of a fixed pool of training episodes (Sec. 4.2's "dataset size", which tags the
            rows); ``None`` when every epoch brings fresh episodes.
    """

    n_points: int
    eval_label_ratios: Sequence[float]
    labeled_subset: str
    test_set_names: list[str] | None
    train_episodes: int | None


@runtime_checkable
class ICSSLNet(Protocol):
    """What ``ICSSLModule`` expects of any net.

    ``net(x, y, labeled)`` maps points ``(B, n, d)``, labels ``(B, n)`` and the labeled mask ``(B, n)`` to an
    :class:`~lit_icl.icssl.nets.ICSSLOutput` (logits ``(B, n, C)``, features ``(B, n, k)``); the labels of
    unlabeled points must not be used. A net that is not a :class:`TwoStageNet` names itself for the result
    rows with a ``method`` attribute (e.g. ``"ORIG+Transformer"``).

    Attributes:
        num_classes: ``C``.
        n_points: the episode size the net was built for, ``None`` if it takes any.
    """

    num_classes: int
    n_points: int | None

    def __call__(self, x: Tensor, y: Tensor, labeled: Tensor) -> ICSSLOutput: ...


@runtime_checkable
class TwoStageNet(ICSSLNet, Protocol):
    """A net whose representation never sees labels (Sec. 4.1's ``[Data + Model]``): ``represent`` then ``classify``.

    The module computes the representation once per batch and re-runs only the head per label ratio, and names
    the model from the representation's class and the head's optional ``method_suffix`` (``LR``, ``RBF-LR``).
    """

    representation: nn.Module
    head: nn.Module

    def represent(self, x: Tensor) -> Tensor: ...

    def classify(self, features: Tensor, y: Tensor, labeled: Tensor) -> Tensor: ...


__all__ = ["ICSSLDataModule", "ICSSLNet", "TwoStageNet"]

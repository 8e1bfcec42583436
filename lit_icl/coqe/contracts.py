"""What CoQE's LightningModules read from their data modules and expect of their nets, as Protocols.

The modules check these with :func:`~lit_icl.core.protocols.implements` (the members exist, and each method takes
the protocol's argument names: ``forward(xs, ys, xq)``, not ``forward(x, y, x_query)``), so a data module or net
written for one of them states its side by having these members, and a mismatch is one
:class:`~lit_icl.core.errors.ConfigError` when the run is built instead of an ``AttributeError`` mid-run.

Omniglot (:class:`~lit_icl.coqe.CoQEClassificationModule`): :class:`SequenceData`, :class:`SequenceNet`.
Regression (:class:`~lit_icl.coqe.CoQERegressionModule`): :class:`PromptData`, :class:`PromptNet` (every net and
baseline), :class:`SizedPromptNet` (nets built for one input dimension and prompt length).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class SequenceData(Protocol):
    """The data side of ``CoQEClassificationModule.bind_datamodule`` (``OmniglotSequenceDataModule``)."""

    #: training classes: the size of the net's read-out over labels
    n_labels: int
    #: image source, ``omniglot`` or ``glyphs``, recorded with the results
    source: str
    #: the data module's arguments; ``p_bursty`` and ``zipf_alpha`` become coordinates of the result rows
    hparams: Mapping[str, Any]


@runtime_checkable
class SequenceNet(Protocol):
    """A sequence classifier (``CoQEClassifier``, ``SequenceTransformer``): logits at every image position."""

    #: ``coqe`` or ``transformer``: which losses, noise and evaluators apply
    method: str
    #: the read-out's class count, ``None`` until the data module sets it
    n_classes: int | None

    def set_n_classes(self, n_classes: int) -> None:
        """Build the read-out for ``n_classes`` (a different count given explicitly is a ConfigError)."""
        ...

    def forward(self, images: Tensor, context_labels: Tensor, noise: Tensor | None = None) -> Any: ...


@runtime_checkable
class PromptData(Protocol):
    """The data side of ``CoQERegressionModule.bind_datamodule`` (``RegressionDataModule``)."""

    #: input dimension d of the prompts
    n_dims: int
    #: points per prompt (the error curve runs over 0 .. n_points - 1 in-context examples)
    n_points: int
    #: ``linear``, ``sparse``, ``relu`` or ``combination``
    function_class: str
    #: the test sets, one dataloader each, ``id`` first
    shift_names: Sequence[str]

    def features(self, x: Tensor) -> Tensor:
        """The task's features of ``x`` (``Phi(x)``, ``ReLU(x W)``): what the sample encoder is compared with."""
        ...


@runtime_checkable
class PromptNet(Protocol):
    """Any regression net or baseline: predicts each prompt position's label from the labels before it.

    The module calls ``net(xs, ys, xq)`` by these names, so a net's ``forward`` must take them.
    """

    #: the ``method`` of its result rows (``coqe``, ``transformer``, ``least_squares`` ...)
    method: str

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor: ...


@runtime_checkable
class SizedPromptNet(PromptNet, Protocol):
    """A net built for one input dimension and a longest prompt (``CoQERegressor``, ``RegressionTransformer``)."""

    n_dims: int
    max_points: int

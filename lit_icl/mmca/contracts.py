"""What mmca's LightningModules read from their data modules and expect of their nets, as Protocols.

Each module checks these with :func:`~lit_icl.core.protocols.implements` (the attributes and methods exist, and
each method takes the protocol's argument names), so a data module or net written for one of them states its side by having these members,
and a mismatch is one :class:`~lit_icl.core.errors.ConfigError` instead of a later ``AttributeError``.

Synthetic experiment (:class:`~lit_icl.mmca.LatentFactorICLModule`):

- :class:`LatentFactorData`: read once in ``bind_datamodule``;
- :class:`PromptNet`: every net (``net(x, y, x_query, m, zeta) -> y_hat``, a ``method`` label for result rows);
- :class:`CovariateNet`: a net built for a covariate dimension ``d`` (checked against the data's);
- :class:`LayeredPromptNet`: a stack of layers (depth sweep, layer scalars, whitening diagnostic).

avMNIST experiment (:class:`~lit_icl.mmca.AVMNISTModule`): :class:`AVMNISTData` and :class:`AVMNISTNet`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor, nn


@runtime_checkable
class LatentFactorData(Protocol):
    """The data side of ``LatentFactorICLModule.bind_datamodule`` (e.g. ``LatentFactorDataModule``)."""

    #: covariate dimension ``d1 + d2`` of the prompts' tokens
    d: int
    #: ``(lo, hi)`` of ``||m||``: nets initialised from ``alpha*`` must be built for the same range
    norm_range: tuple[float, float]
    #: the ``L_te`` sweep of ``test`` (the test prompts hold the longest)
    test_context_lengths: Sequence[int]


@runtime_checkable
class PromptNet(Protocol):
    """Any net of the synthetic experiment: maps a prompt to a prediction of ``y_q``, ``(B,)``."""

    #: the ``method`` of its result rows (e.g. ``lca_one``, ``sample_mean``)
    method: str

    def forward(
        self, x: Tensor, y: Tensor, x_query: Tensor, m: Tensor | None = None, zeta: Tensor | None = None
    ) -> Tensor: ...


@runtime_checkable
class CovariateNet(PromptNet, Protocol):
    """A net built for one covariate dimension (``SingleLayerLSA``, ``DeepCrossAttention``)."""

    d: int


@runtime_checkable
class LayeredPromptNet(CovariateNet, Protocol):
    """A stack of ``depth`` layers (``DeepCrossAttention``): runs at other depths when ``tied``, reports its
    layer weights (App. H's normalised traces) and states (the whitening diagnostic, Eq. 6.1)."""

    depth: int
    #: weights shared across layers, so ``forward(..., depth=t)`` runs at any ``t``
    tied: bool
    #: the ``||m||`` range its ``alpha*`` initialisation was computed for
    norm_range: tuple[float, float]

    def forward(
        self,
        x: Tensor,
        y: Tensor,
        x_query: Tensor,
        m: Tensor | None = None,
        zeta: Tensor | None = None,
        depth: int | None = None,
    ) -> Tensor: ...

    def layer_weights(self) -> tuple[Tensor, Tensor]: ...

    def layer_states(self, x: Tensor, depth: int | None = None) -> list[Tensor]: ...


@runtime_checkable
class AVMNISTData(Protocol):
    """The data side of ``AVMNISTModule.bind_datamodule`` (e.g. ``AVMNISTDataModule``)."""

    #: the split each validation loader scores, in order; must include ``"test"`` (Table 1)
    eval_splits: list[str]
    #: corruption level, written on every result row
    noise_std: float
    #: the data folder; its name is written on every result row
    root: str


@runtime_checkable
class AVMNISTNet(Protocol):
    """A Table-1 net: ``represent`` gives what the classifier ``head`` reads (also the embeddings the
    representation metrics score); ``forward(image, audio) = head(represent(image, audio))``."""

    head: nn.Module

    def represent(self, image: Tensor, audio: Tensor) -> Tensor: ...

    def forward(self, image: Tensor, audio: Tensor) -> Tensor: ...

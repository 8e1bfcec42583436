"""What :class:`~lit_icl.i2cl.I2CLModule` needs of its data module and of its net, written as Protocols.

:func:`~lit_icl.core.protocols.implements` checks them at run time (member names and each method's argument
names; the docstrings say what the values mean). The shipped :class:`~lit_icl.i2cl.I2CLDataModule` and :class:`~lit_icl.i2cl.CausalLM` satisfy them
(``tests/i2cl/test_contracts.py``); another LM wrapper or task source works with the module when it does too.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from lit_icl.i2cl.data import TaskData


@runtime_checkable
class I2CLData(Protocol):
    """What ``I2CLModule.bind_datamodule`` reads from the data module.

    Attributes:
        data_seed: the seed of the run's demonstrations; it seeds the noise vectors and the plain calibration
            loop, and tags the test rows (``seed``).
    """

    data_seed: int

    def task_data(self) -> TaskData:
        """The run's task as text: demonstrations, holdout and evaluation queries, template, label words."""
        ...


@runtime_checkable
class I2CLNet(Protocol):
    """What ``I2CLModule`` expects of its frozen LM (see :class:`~lit_icl.i2cl.CausalLM` for each member).

    Attributes:
        n_layers: ``L``, the decoder blocks (one pair of coefficients per block and sub-layer).
        hidden_size: ``D``, the residual stream's width.
        kv_width: one layer's key (or value) cache width per token (the cached-parameter count of few-shot ICL).
        max_positions: the longest prompt the LM takes, in tokens.
    """

    n_layers: int
    hidden_size: int
    kv_width: int
    max_positions: int

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]: ...

    def n_tokens(self, text: str) -> int: ...

    def label_token_ids(self, query: str, label_words: Sequence[str]) -> list[int]: ...

    def last_logits(self, ids: Tensor, mask: Tensor) -> Tensor: ...

    def calibration_logits(self, ids: Tensor, mask: Tensor) -> Tensor: ...

    @property
    def calibration_compiled(self) -> bool: ...

    def draw_noise(self, ids: Tensor, noise_first: bool = True) -> Tensor: ...

    def demonstration_vectors(self, demos: Sequence[str]) -> Tensor: ...

    def inject(self, context: Tensor, coef: Tensor, gamma: float = 0.0, noise_norm: str = "sublayer",
               noise_first: bool = True, noise: Tensor | None = None) -> AbstractContextManager[None]: ...

    def replace_hidden(self, layer: int, vector: Tensor, mask: Tensor) -> AbstractContextManager[None]: ...

    def last_hidden_per_layer(self, text: str) -> Tensor: ...


__all__ = ["I2CLData", "I2CLNet"]

"""The whitening diagnostic of Sec. 6-7 (Fig. 3 right) as a Lightning callback."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from lit_icl.core.errors import ConfigError
from lit_icl.core.precision import float32_region
from lit_icl.core.protocols import implements
from lit_icl.core.results import result_row
from lit_icl.core.validation import check_positive
from lit_icl.metrics.mean import SyncFreeMean
from lit_icl.mmca.contracts import LatentFactorData, LayeredPromptNet, PromptNet


@float32_region
def whitening_residuals(x: Tensor, states: list[Tensor]) -> Tensor:
    """``||X F_t^T / L - I||_F / sqrt(d)`` per prompt and layer: ``(B, T)``.

    Args:
        x: ``(B, L, d)`` token-major covariates.
        states: ``[F_1, ..., F_T]``, each ``(B, d, L)`` (column layout, as returned by ``layer_states``).

    Eq. (6.1): the readout is Bayes-optimal when ``X F^T / L -> I``, e.g. when ``F ~ Lambda^{-1} X`` whitens the
    covariates. For the tied LCA, ``X F_T^T / L = I - (I - alpha Lambda_hat)^T`` exactly (Lemma C.2).
    """
    xc = x.float().transpose(1, 2)
    d, L = xc.shape[1], xc.shape[2]
    eye = torch.eye(d, device=x.device)
    out = [((xc @ f.transpose(1, 2)) / L - eye).flatten(1).norm(dim=-1) / d**0.5 for f in states]
    return torch.stack(out, dim=-1)


class WhiteningDiagnostic(Callback):
    """During ``test``, averages the whitening residual of every layer of the net over the test prompts.

    Works with any :class:`~lit_icl.mmca.contracts.LayeredPromptNet` (``layer_states(x) -> [F_1, ..., F_T]``: the CA stacks of
    :mod:`lit_icl.mmca.synthetic.nets`); others are skipped. At the end of the test epoch it logs
    ``test/whitening_residual/layer=t`` and hands rows (metric ``whitening_residual``, coordinates ``layer``,
    ``depth``, ``context_length``) as its own ``test_rows``, which :class:`lit_icl.core.results.ResultsWriter`
    writes next to the module's.

    Args:
        context_length: ``L`` of the prompts the diagnostic uses (their first ``L`` tokens); default: all the
            tokens of the test prompts (the largest ``L_te``).
    """

    def __init__(self, context_length: int | None = None):
        if context_length is not None:
            check_positive("context_length", context_length, integer=True, hint="or null for all the tokens")
        self.context_length = context_length
        self._metrics: list[SyncFreeMean] = []
        self._length: int | None = None
        #: Rows of the last test epoch, written by ResultsWriter beside the module's.
        self.test_rows: list[dict] = []

    def check_config(self, trainer: Any = None, model: Any = None, datamodule: Any = None) -> None:
        """Before the run: the diagnostic's context must fit in the test prompts (their longest ``L_te``)."""
        lengths = datamodule.test_context_lengths if implements(datamodule, LatentFactorData) else None
        if self.context_length is not None and lengths and self.context_length > max(lengths):
            raise ConfigError(
                f"WhiteningDiagnostic context_length={self.context_length} exceeds the longest test context "
                f"{max(lengths)}; use at most {max(lengths)} or null"
            )

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._metrics = []
        self.test_rows = []
        self._length = None

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        net = getattr(pl_module, "net", None)
        if not implements(net, LayeredPromptNet):
            return
        x = batch["x"]
        L = self.context_length or x.shape[1]
        if L > x.shape[1]:
            raise ValueError(
                f"WhiteningDiagnostic context_length={L} exceeds the test prompts' {x.shape[1]} tokens"
            )
        x = x[:, :L]
        res = whitening_residuals(x, net.layer_states(x))
        if not self._metrics:
            self._metrics = [SyncFreeMean().to(res.device) for _ in range(res.shape[1])]
        for t, metric in enumerate(self._metrics):
            metric.update(res[:, t])
        self._length = L

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._metrics:
            return
        net = pl_module.net
        method = str(net.method) if implements(net, PromptNet) else type(net).__name__
        depth = len(self._metrics)
        rows = []
        for t, metric in enumerate(self._metrics):
            value = float(metric.compute())
            pl_module.log(f"test/whitening_residual/layer={t + 1}", value, sync_dist=True)
            rows.append(
                result_row(
                    "whitening_residual",
                    value,
                    method=method,
                    layer=t + 1,
                    depth=depth,
                    context_length=self._length,
                )
            )
        self.test_rows = rows

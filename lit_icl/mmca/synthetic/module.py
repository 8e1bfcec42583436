"""The LightningModule for multi-modal ICL on latent-factor prompts: the empirical loss of Sec. 6 and the
test protocol of Sec. 7 / App. G-H.

Training minimises ``l_{N, L_tr} = (1/N) sum_j (y_q^(j) - y_hat_q^(j))^2`` by (full-batch, if the data module
says so) gradient descent. ``test`` sweeps the test context lengths ``L_te`` (and, for nets whose weights are
tied across layers, the depths ``test_depths``) on the same fixed test prompts and reports, per setting:

- ``icl_error``: ``mean (y_hat_q - <w, x_q>)^2``, the squared distance to the Bayes predictor of Eq. (3.3),
  which the ICL criterion (4.1) asks to vanish as ``L_te -> inf`` (the Bayes predictor scores 0);
- ``mse``: ``mean (y_hat_q - y_q)^2``, which adds the irreducible ``E[1/Z]`` (the Bayes predictor's MSE).

The parameter-free in-context sample mean and the Bayes predictor run next to the net (``baselines``). Nets
with layer weights add ``alpha_hat`` / ``beta_hat`` per layer (App. H's normalised traces) and ``alpha_star``; the
:class:`~lit_icl.mmca.synthetic.diagnostics.WhiteningDiagnostic` callback adds ``whitening_residual`` per layer as its own rows.
The module's numbers land in ``self.test_rows`` (tidy rows, one number each); :meth:`test_figures` draws Figs. 2,
3, 5, 6 from those and the callback's rows together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.optim import fused_if_cuda
from lit_icl.core.protocols import data_refusal, implements
from lit_icl.core.results import result_row
from lit_icl.core.validation import (
    check_literal,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_range,
)
from lit_icl.metrics.mean import SyncFreeMean
from lit_icl.mmca.contracts import CovariateNet, LatentFactorData, LayeredPromptNet, PromptNet
from lit_icl.mmca.synthetic.nets import BayesOptimal, DeepCrossAttention, SampleMean
from lit_icl.mmca.theory import alpha_star, alpha_star_depth, bayes_weights

Optimizer = Literal["sgd", "adam"]


def method_name(net: nn.Module) -> str:
    """The ``method`` of a net's rows: its ``method`` attribute (:class:`PromptNet`), else its class name."""
    return str(net.method) if implements(net, PromptNet) else type(net).__name__


class LatentFactorICLModule(ICLModule):
    """Trains a net of :mod:`lit_icl.mmca.synthetic.nets` on the squared query error and runs the ``L_te`` / depth sweep.

    Args:
        net: e.g. ``DeepCrossAttention(parametrization="one")`` (default), ``SingleLayerLSA()``, ``SampleMean()``.
        lr: learning rate.
        optimizer: ``sgd`` (plain gradient descent, App. H) or ``adam``.
        momentum: SGD momentum (0 is plain gradient descent).
        weight_decay: L2 penalty of the optimiser.
        test_depths: depths at which a net with tied weights is also evaluated (default: its own depth only).
        baselines: also evaluate the sample mean and the Bayes predictor on the test prompts.
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        lr: float = 0.01,
        optimizer: Optimizer = "sgd",
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        test_depths: Sequence[int] | None = None,
        baselines: bool = True,
    ):
        super().__init__()
        self.save_reloadable_hparams()
        self.net = net if net is not None else DeepCrossAttention()
        self.test_depths = self._validate(lr, optimizer, momentum, weight_decay, test_depths)
        self.method = method_name(self.net)
        self.baseline_nets = nn.ModuleList([SampleMean(), BayesOptimal()]) if baselines else nn.ModuleList()
        self.val_mse = SyncFreeMean()
        self.val_icl = SyncFreeMean()
        self.test_metrics = nn.ModuleDict()
        self.context_lengths: list[int] | None = None
        self.norm_range: tuple[float, float] | None = None

    def _validate(
        self,
        lr: float,
        optimizer: str,
        momentum: float,
        weight_decay: float,
        test_depths: Sequence[int] | None,
    ) -> list[int | None]:
        """Check the arguments against each other and the net; returns the depths ``test`` sweeps."""
        check_positive("lr", lr)
        check_literal("optimizer", optimizer, Optimizer)
        check_range("momentum", momentum, 0.0, 1.0, high_inclusive=False, hint="0 is plain gradient descent")
        if optimizer == "adam" and momentum:
            raise ConfigError(f"momentum={momentum} is SGD's; optimizer=adam ignores it: drop momentum or use optimizer sgd")
        check_nonnegative("weight_decay", weight_decay)
        layered = implements(self.net, LayeredPromptNet)
        if test_depths is None:
            return [self.net.depth] if layered else [None]
        depths = check_nonempty("test_depths", test_depths, example="[1, 5, 10]")
        for t in depths:
            check_positive("test_depths entry", t, integer=True)
        if not layered:
            raise ConfigError(
                f"test_depths needs a net with layers; {type(self.net).__name__} has none, drop it"
            )
        if not self.net.tied and depths != [self.net.depth]:
            raise ConfigError(
                f"test_depths={depths} needs weights tied across layers (parametrization 'one' or 'two'); "
                f"this net is trained for depth {self.net.depth} only"
            )
        return sorted(set(depths))

    # ---------------------------------------------------------------- wiring with the data
    def validation_keys(self) -> set[str]:
        return {"val/icl_error", "val/mse"}

    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """Check the net against the data's ``d`` and ``norm_range``; take the test context lengths from it."""
        dm = datamodule
        if not implements(dm, LatentFactorData):
            raise data_refusal(dm, LatentFactorData, "LatentFactorICLModule", "lit_icl.mmca.LatentFactorDataModule")
        if implements(self.net, CovariateNet) and dm.d != self.net.d:
            raise ConfigError(
                f"the net was built for d={self.net.d} but the data has d = d1 + d2 = {dm.d}; set the net's d to "
                f"{dm.d}"
            )
        nr = tuple(dm.norm_range)
        if implements(self.net, LayeredPromptNet) and nr != tuple(self.net.norm_range):
            raise ConfigError(
                f"the net's norm_range={tuple(self.net.norm_range)} (used for its alpha* initialisation) differs "
                f"from the data's norm_range={nr}; set the net's norm_range to {list(nr)}"
            )
        self.norm_range = nr
        self.context_lengths = list(dm.test_context_lengths)

    # ---------------------------------------------------------------- training
    def forward(
        self, batch: dict[str, Tensor], depth: int | None = None, net: nn.Module | None = None
    ) -> Tensor:
        net = self.net if net is None else net
        kwargs = {"depth": depth} if depth is not None and implements(net, LayeredPromptNet) else {}
        return net(*self.net_inputs(batch), **kwargs)

    @staticmethod
    def net_inputs(batch: dict[str, Tensor]) -> tuple[Tensor | None, ...]:
        """What a net takes from a batch: ``(x, y, x_query, m, zeta)``, the last two ``None`` where absent."""
        return batch["x"], batch["y"], batch["x_query"], batch.get("m"), batch.get("zeta")

    @staticmethod
    def training_loss(pred: Tensor, y_query: Tensor) -> Tensor:
        """``l_{N, L_tr}`` on a batch (Sec. 6): the squared error of the query predictions; the training step runs
        the net and this as one module (:attr:`training_objective`, one compiled region)."""
        return (pred - y_query.float()).pow(2).mean()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, _ = self.training_objective(self.net_inputs(batch), (batch["y_query"],))
        self.log_loss("train/loss", loss)
        # Each self.log costs host time: the scalars go to the loggers on logging steps only.
        if self.logging_step and implements(self.net, LayeredPromptNet) and self.net.tied:
            self.log("train/alpha", self.net.alpha.detach())
            if hasattr(self.net, "beta"):
                self.log("train/beta", self.net.beta.detach())
        return loss

    @staticmethod
    def _errors(pred: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Per-prompt squared distance to the Bayes prediction and to ``y_q``."""
        bayes = (bayes_weights(batch["m"].float(), batch["zeta"].float()) * batch["x_query"].float()).sum(-1)
        return (pred - bayes).pow(2), (pred - batch["y_query"].float()).pow(2)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        icl, mse = self._errors(self(batch), batch)
        self.val_icl.update(icl)
        self.val_mse.update(mse)
        self.log("val/icl_error", self.val_icl, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/mse", self.val_mse, on_step=False, on_epoch=True)

    # ---------------------------------------------------------------- test protocol
    def _metric(self, key: str) -> SyncFreeMean:
        if key not in self.test_metrics:
            self.test_metrics[key] = SyncFreeMean().to(self.device)
        return self.test_metrics[key]

    def on_test_epoch_start(self) -> None:
        self.test_metrics = nn.ModuleDict()
        self.test_rows = []

    def _lengths(self, batch: dict[str, Tensor]) -> list[int]:
        available = batch["x"].shape[1]
        lengths = self.context_lengths or [available]
        too_long = [L for L in lengths if L > available]
        if too_long:
            raise ValueError(f"test context lengths {too_long} exceed the prompts' {available} tokens")
        return lengths

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        for L in self._lengths(batch):
            # Shorter contexts are prefixes of the same prompts: every L_te is scored on the same tasks.
            sub = dict(batch, x=batch["x"][:, :L], y=batch["y"][:, :L])
            runs = [(self.method, depth, self.net) for depth in self.test_depths]
            runs += [(method_name(b), None, b) for b in self.baseline_nets]
            for method, depth, net in runs:
                icl, mse = self._errors(self(sub, depth=depth, net=net), batch)
                key = f"{method}__T{depth}__L{L}"
                self._metric(f"icl_error__{key}").update(icl)
                self._metric(f"mse__{key}").update(mse)

    def on_test_epoch_end(self) -> None:
        rows: list[dict[str, Any]] = []
        for key, metric in self.test_metrics.items():
            name, method, depth, length = key.split("__")
            value = metric.compute()  # synced across ranks by torchmetrics
            coords: dict[str, Any] = {"context_length": int(length[1:])}
            if depth != "TNone":
                coords["depth"] = int(depth[1:])
            rows.append(result_row(name, float(value), method=method, **coords))
            tag = "/".join(f"{k}={v}" for k, v in coords.items())
            self.log(f"test/{name}/{method}/{tag}", value, sync_dist=True)
        rows += self._layer_rows()
        self.test_rows = rows

    def _layer_rows(self) -> list[dict[str, Any]]:
        """``alpha_hat_t = tr(W^S_t)/d``, ``beta_hat_t = tr(W^V_t)/d`` (App. H) and ``alpha*`` (Theorem 6.2)."""
        net = self.net
        if not implements(net, LayeredPromptNet):
            return []
        rows = []
        ws, wv = net.layer_weights()
        d, depth = ws.shape[-1], ws.shape[0]
        for t in range(depth):
            # layer t+1 computes F_{t+1} from (W^S_t, W^V_t): the same index as the whitening diagnostic
            rows.append(
                result_row(
                    "alpha_hat",
                    float(ws[t].diagonal().sum() / d),
                    method=self.method,
                    layer=t + 1,
                    depth=depth,
                )
            )
            rows.append(
                result_row(
                    "beta_hat",
                    float(wv[t].diagonal().sum() / d),
                    method=self.method,
                    layer=t + 1,
                    depth=depth,
                )
            )
        norm_range = self.norm_range or net.norm_range
        if norm_range is not None:
            rows.append(result_row("alpha_star", alpha_star(norm_range), method="theory"))
            rows.append(
                result_row("alpha_star_T", alpha_star_depth(depth, norm_range), method="theory", depth=depth)
            )
        return rows

    # ---------------------------------------------------------------- figures
    def test_figures(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Figs. 2 (left, right), 3 (left, right), 5 and 6 from tidy rows (also rows gathered from several runs).

        Returns matplotlib figures by name; a figure is left out when the rows hold nothing for it.
        """
        from lit_icl.mmca.synthetic.figures import mmca_figures

        return mmca_figures(rows)

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        if hp.optimizer == "adam":
            return torch.optim.Adam(params, lr=hp.lr, weight_decay=hp.weight_decay, **fused_if_cuda(params))
        return torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)

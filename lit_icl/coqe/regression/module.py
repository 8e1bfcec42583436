"""The CoQE regression LightningModule: the all-prefix MSE objective and Fig. 3's error curves (Sec. 5.1, App. C.1).

Training minimises ``E_P[(1/k) sum_{i<k} l(M(P^i), f(x_{i+1}))]`` (Sec. 5.1): the squared error of every prefix's
prediction, averaged over prefixes and prompts, in one causal pass. ``test`` evaluates the net and the listed
parameter-free baselines on every test distribution of the data module (``id`` first, then the OOD shifts) and
leaves tidy rows ``mse`` (squared error divided by the input dimension d, averaged over the test prompts) with
coordinates ``n_context`` (examples before the query), ``shift``, ``function_class``, ``optimal`` (the
baseline Fig. 3 marks as optimal for the class) and figures: error vs number of examples per shift, and for
``combination`` (and ``relu``) the learned sample representation against the class's features (Fig. 6).

The Fig. 6 panel is a linear probe: on the ID test inputs the net's sample representation ``s(x)`` (width 64)
is regressed onto ``Phi(x)`` by least squares; the probe's 5-dim output is plotted against each coordinate with
the true ``Phi_j``, and its R^2 per feature is a result row (``probe_r2``). The ID test step also returns
``{"embeddings": {"learned": s(x), "features": Phi(x)}}`` so :class:`~lit_icl.callbacks.RepresentationMetrics`
scores their mNN alignment.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor, nn
from torchmetrics import Metric

from lit_icl.coqe.contracts import PromptData, PromptNet, SizedPromptNet
from lit_icl.coqe.regression.nets import CoQERegressor
from lit_icl.core.errors import ConfigError
from lit_icl.core.figures import line_figure, new_figure
from lit_icl.core.module import ICLModule
from lit_icl.core.nets import count_parameters
from lit_icl.core.optim import fused_if_cuda
from lit_icl.core.precision import float32_region
from lit_icl.core.protocols import contract_summary, data_refusal, implements, unmet
from lit_icl.core.results import result_row
from lit_icl.core.validation import check_int, check_positive
from lit_icl.metrics.mean import SyncFreeMean

#: Fig. 3's optimal baseline per function class (method-name prefix; the best alpha among Lasso nets).
OPTIMAL: dict[str, str | None] = {
    "linear": "least_squares", "sparse": "lasso", "relu": "two_layer_nn", "combination": None,
}
#: Classes whose tasks share a non-trivial representation (probe and mNN alignment are meaningful there).
REPRESENTATION_CLASSES = ("relu", "combination")


class PrefixSquaredError(Metric):
    """Sum of squared errors per prompt position and the number of prompts (synced by summation)."""

    full_state_update = False

    def __init__(self, n: int):
        super().__init__()
        self.add_state("sse", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.sse += ((pred.double() - target.double()) ** 2).sum(0)
        self.count += pred.shape[0]

    def compute(self) -> Tensor:
        return self.sse / self.count.clamp_min(1)


class CoQERegressionModule(ICLModule):
    """Trains a regression net on prompts of one function class; tests it with baselines, ID and OOD (Sec. 5.1).

    Args:
        net: :class:`~lit_icl.coqe.regression.nets.CoQERegressor` (default),
            :class:`~lit_icl.coqe.regression.nets.RegressionTransformer`, or a parameter-free baseline (then only
            ``test`` runs). Its ``n_dims`` must equal the data's (checked at setup).
        baselines: parameter-free nets evaluated in ``test`` beside ``net`` (least squares, Lasso per alpha, the
            two-layer network fit by Adam, averaging, nearest neighbours).
        lr: Adam learning rate (5e-5, App. C.1; Garg et al. 1e-4).
        probe_points: at most this many ID test inputs for the Fig. 6 probe.
    """

    precisions = ("32-true", "bf16-mixed", "16-mixed")
    precisions_why = ("its step builds the task representations in float32")

    def __init__(
        self,
        net: nn.Module | None = None,
        baselines: list[nn.Module] | None = None,
        lr: float = 5e-5,
        probe_points: int = 4096,
    ):
        super().__init__()
        self.save_reloadable_hparams()
        self.net = net if net is not None else CoQERegressor()
        self.baselines = nn.ModuleList(baselines or [])
        for m in [self.net, *self.baselines]:
            if not implements(m, PromptNet) or not isinstance(m.method, str):
                problems = unmet(m, PromptNet) or [f"method is {m.method!r}, not a str"]
                raise ConfigError(
                    f"{type(m).__name__} is not a regression net: {'; '.join(problems)} (a net of your own needs "
                    f"{contract_summary(PromptNet)}: lit_icl.coqe.contracts.PromptNet); or use "
                    "lit_icl.coqe.CoQERegressor, RegressionTransformer or a baseline such as LeastSquares"
                )
        for b in self.baselines:
            if any(p.requires_grad for p in b.parameters()):
                raise ConfigError(f"baseline {type(b).__name__} has trainable parameters; give it as `net` instead")
        names = [m.method for m in [self.net, *self.baselines]]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"methods {dup} appear twice among net and baselines; list each once")
        check_positive("lr", lr, hint="5e-5 in App. C.1")
        check_int("probe_points", probe_points, 0)
        self.method: str = self.net.method
        self.methods = names
        self.function_class: str | None = None
        self.n_dims: int | None = None
        self.shift_names: list[str] = ["id"]
        self.errors = nn.ModuleDict()
        self.val_mse = SyncFreeMean()
        self._features = None
        self._probe: list[tuple[Tensor, Tensor, Tensor]] = []
        self._probe_result: dict[str, Any] | None = None

    # ---------------------------------------------------------------- data binding
    def validation_keys(self) -> set[str]:
        return {"val/mse"}

    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """The nets' input dimension and prompt length must fit the data; record class and shifts."""
        if not implements(datamodule, PromptData):
            raise data_refusal(datamodule, PromptData, "CoQERegressionModule", "lit_icl.coqe.RegressionDataModule")
        n_dims, n_points = datamodule.n_dims, datamodule.n_points
        for m in [self.net, *self.baselines]:
            if not implements(m, SizedPromptNet):
                continue  # parameter-free baselines take any dimension and length
            if m.n_dims != n_dims:
                raise ConfigError(
                    f"{type(m).__name__} has n_dims={m.n_dims} but the data has {n_dims}; "
                    f"set model.init_args.net.init_args.n_dims: {n_dims}"
                )
            if n_points > m.max_points:
                raise ConfigError(
                    f"{type(m).__name__} has max_points={m.max_points} < the data's n_points={n_points}; raise max_points"
                )
        self.function_class = datamodule.function_class
        self.n_dims = n_dims
        self.shift_names = list(datamodule.shift_names)
        self._features = datamodule.features
        self.errors = nn.ModuleDict(
            {self._key(s, m): PrefixSquaredError(n_points) for s in self.shift_names for m in self.methods}
        )

    @staticmethod
    def _key(shift: str, method: str) -> str:
        return f"{shift}|{method}".replace(".", "_")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["coqe_regression"] = {"function_class": self.function_class, "n_dims": self.n_dims}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get("coqe_regression", {})
        self.function_class = saved.get("function_class", self.function_class)
        self.n_dims = saved.get("n_dims", self.n_dims)

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor:
        """The net's predictions for prompts ``xs`` (B, n, d) with values ``ys`` (B, n): at every prompt point from
        the points before it, or at queries ``xq``, as ``model(xs, ys)`` in a notebook."""
        return self.net(xs, ys, xq)

    # ---------------------------------------------------------------- training
    @staticmethod
    def training_loss(pred: Tensor, ys: Tensor) -> Tensor:
        """The squared error of every prefix's prediction, over all prompts (Sec. 5.1); the training step runs the
        net and this as one module (:attr:`training_objective`, one compiled region)."""
        return ((pred.float() - ys.float()) ** 2).mean()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        xs, ys = batch["xs"], batch["ys"]
        loss, _ = self.training_objective((xs, ys), (ys,))
        self.log_loss("train/loss", loss)
        if self.logging_step:  # each self.log costs host time: only the values the loggers write
            self.log("train/mse", loss.detach() / xs.shape[-1])  # normalised by d, as the test rows
            self.log("train/n_points", torch.tensor(float(xs.shape[1])))  # a host number: no copy to the device
        return loss

    # ---------------------------------------------------------------- evaluation
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        xs, ys = batch["xs"], batch["ys"]
        pred = self.net(xs, ys)
        self.val_mse.update(((pred.float() - ys.float()) ** 2).mean(-1) / xs.shape[-1])
        self.log("val/mse", self.val_mse, on_step=False, on_epoch=True, prog_bar=True)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any] | None:
        if not self.errors:
            raise RuntimeError("CoQERegressionModule.test needs a RegressionDataModule (bind_datamodule was not called)")
        shift = self.shift_names[dataloader_idx]
        xs, ys = batch["xs"], batch["ys"]
        xq, yq = batch.get("xq"), batch.get("yq", ys)
        for m in [self.net, *self.baselines]:
            metric = self.errors[self._key(shift, m.method)]
            metric.to(ys.device).update(m(xs, ys, xq), yq)
        if dataloader_idx != 0 or self.function_class not in REPRESENTATION_CLASSES or self._features is None:
            return None
        rep = getattr(self.net, "sample_representation", None)
        if rep is None:
            return None
        learned, features = rep(xs).float(), self._features(xs).float()
        take = self.hparams.probe_points - sum(len(p[0]) for p in self._probe)
        if take > 0:
            self._probe.append(tuple(
                t.reshape(-1, t.shape[-1])[:take].detach().cpu() for t in (xs, learned, features)
            ))
        return {"embeddings": {"learned": learned, "features": features}}

    def on_test_epoch_start(self) -> None:
        self._probe = []
        self._probe_result = None

    def on_test_epoch_end(self) -> None:
        rows: list[dict[str, Any]] = []
        coords = {"function_class": self.function_class, "n_dims": self.n_dims}
        curves: dict[tuple[str, str], Tensor] = {}
        for shift in self.shift_names:
            for method in self.methods:
                metric = self.errors[self._key(shift, method)]
                curves[shift, method] = (metric.compute() / (self.n_dims or 1)).cpu()  # synced across ranks
                metric.reset()
        optimal = self._optimal_method(curves)
        for (shift, method), curve in curves.items():
            for i, v in enumerate(curve.tolist()):
                rows.append(result_row("mse", v, method=method, shift=shift, n_context=i,
                                       optimal=method == optimal, **coords))
            # compute() already synced the ranks; sync_dist averages identical values and stops Lightning's
            # warning under DDP that this metric is not accumulated across devices (it is).
            self.log(f"test/mse/{shift}/{method}/last", float(curve[-1]), sync_dist=True)
        rows.append(result_row("parameters", count_parameters(self.net), method=self.method, **coords))
        rows.extend(self._probe_rows(coords))
        self.test_rows = rows

    def _optimal_method(self, curves: dict[tuple[str, str], Tensor]) -> str | None:
        """Fig. 3's optimal baseline among those evaluated: by class; the best Lasso alpha (ID mean) for sparse."""
        prefix = OPTIMAL.get(self.function_class or "")
        if prefix is None:
            return None
        found = [m for m in self.methods if m.startswith(prefix)]
        return min(found, key=lambda m: float(curves["id", m].mean())) if found else None

    @float32_region
    def _probe_rows(self, coords: dict[str, Any]) -> list[dict[str, Any]]:
        """Linear probe ``s(x) -> features(x)`` with intercept; R^2 per feature (Fig. 6 as numbers)."""
        if not self._probe:
            return []
        x, s, phi = (torch.cat(t).double() for t in zip(*self._probe))
        design = torch.cat([s, torch.ones(len(s), 1, dtype=s.dtype)], dim=1)
        coef = torch.linalg.lstsq(design, phi, driver="gelsd").solution
        fit = design @ coef
        r2 = 1 - ((fit - phi) ** 2).sum(0) / ((phi - phi.mean(0)) ** 2).sum(0).clamp_min(1e-12)
        self._probe_result = {"x": x, "fit": fit, "phi": phi}
        return [result_row("probe_r2", v, method=self.method, feature=j, shift="id", **coords)
                for j, v in enumerate(r2.tolist())]

    def test_figures(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``mse_<shift>``: error vs examples per method (Fig. 3; optimal baseline dashed); ``sample_representation``."""
        figures: dict[str, Any] = {}
        optimal = {r["method"] for r in rows if r.get("optimal")}
        for shift in dict.fromkeys(r["shift"] for r in rows if r["metric"] == "mse"):
            fig = line_figure(
                rows, "n_context", metric="mse", shift=shift, xlabel="in-context examples",
                ylabel="squared error / d", title=f"{self.function_class} ({shift})",
            )
            ax = fig.axes[0]
            for line in ax.get_lines():
                if line.get_label() in optimal:
                    line.set_linestyle("--")
                    line.set_label(f"{line.get_label()} (optimal)")
            ax.legend(fontsize="small")
            figures[f"mse_{shift}".replace("=", "_")] = fig
        if self._probe_result is not None:
            figures["sample_representation"] = self._probe_figure()
        return figures

    def _probe_figure(self) -> Any:
        x, fit, phi = (self._probe_result[k] for k in ("x", "fit", "phi"))
        k = phi.shape[1]
        fig, _ = new_figure(width=3.0 * k, height=3.0)
        fig.clf()
        axes = fig.subplots(1, k)
        axes = list(axes) if k > 1 else [axes]
        for j, ax in enumerate(axes):
            # Phi_j depends on x_j alone for combination functions; for ReLU features use the projection on w_j.
            u = x[:, j] if self.function_class == "combination" else x @ self._relu_direction(j, x, phi)
            order = u.argsort()
            ax.scatter(u, fit[:, j], s=2, alpha=0.3, label="probe of s(x)")
            ax.plot(u[order], phi[order, j], color="black", linewidth=1, label="true feature")
            ax.set_title(f"feature {j + 1}")
            ax.set_xlabel("x_j" if self.function_class == "combination" else "w_j^T x / |w_j|")
        axes[0].legend(fontsize="small")
        fig.suptitle(f"learned sample representation ({self.method}) vs task features")
        return fig

    @staticmethod
    def _relu_direction(j: int, x: Tensor, phi: Tensor) -> Tensor:
        """Unit direction ``w_j`` of ReLU feature ``j`` recovered from the data (``phi_j = ReLU(x w_j)``)."""
        active = phi[:, j] > 0
        w = torch.linalg.lstsq(x[active], phi[active, j:j + 1]).solution[:, 0]
        return w / w.norm().clamp_min(1e-12)

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr, **fused_if_cuda(self.net.parameters()))

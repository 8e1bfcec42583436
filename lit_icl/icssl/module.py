"""The IC-SSL LightningModule: the in-context semi-supervised loss (Eq. 4) and the label-ratio protocol.

Batches are dicts from :mod:`lit_icl.icssl.data`:

- training: ``x (B, n, d)``, ``y (B, n)`` and ``n_labeled (B,)``; the first ``n_labeled`` points of each
  episode are labeled (points are i.i.d., so the first ``m`` are a uniformly random subset);
- validation / test: ``x`` and ``y``; every batch is evaluated at every ratio of ``label_ratios`` with
  ``m = round(ratio * n)`` labeled points, on the same episodes, so the ratios are compared pairwise.

The representation never sees labels, so it is computed once per batch and the GD head is re-run per ratio.
``test`` writes ``results.json``, ``results.csv`` and ``accuracy_vs_label_ratio.png`` into the run folder and
logs the figure to TensorBoard.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchvision.transforms.functional import pil_to_tensor

from lit_icl.core.errors import ConfigError
from lit_icl.core.plotting import line_plot_png
from lit_icl.core.spectral import laplacian_eigenmap
from lit_icl.core.validation import (
    check_choice,
    check_int,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_unique,
)
from lit_icl.icssl.nets import SemiSupervisedICL, count_parameters

DEFAULT_LABEL_RATIOS = (0.03, 0.05, 0.10, 0.15, 0.25, 0.39)


def labeled_count(ratio: float, n_points: int) -> int:
    """``m = round(ratio * n)``: the number of labeled points of an episode at a label ratio."""
    return int(round(ratio * n_points))


def check_label_ratios(ratios: Sequence[float], n_points: int) -> None:
    """Refuse label ratios outside (0, 1) or ones that leave no labeled or no unlabeled point."""
    for r in ratios:
        if not 0.0 < r < 1.0:
            raise ConfigError(f"label ratio {r} is outside (0, 1); use fractions such as 0.03 or 0.25")
        m = labeled_count(r, n_points)
        if m < 1:
            raise ConfigError(
                f"label ratio {r} leaves no labeled point in episodes of {n_points} points "
                f"(round({r} * {n_points}) = 0); use a ratio >= {0.5 / n_points:.3g}"
            )
        if m >= n_points:
            raise ConfigError(
                f"label ratio {r} labels all {n_points} points, leaving nothing to predict; use a smaller ratio"
            )


def ratio_key(ratio: float) -> str:
    """The name under which a ratio's metrics are logged, e.g. ``label_ratio=0.25``."""
    return f"label_ratio={ratio:g}"


def _slot(ratio: float) -> str:
    """A ``ModuleDict`` key for a ratio's metric (module names cannot contain dots)."""
    return ratio_key(ratio).replace(".", "_")


class ICSSLModule(LightningModule):
    """Trains an IC-SSL net with the semi-supervised cross-entropy of Eq. (4) on the unlabeled points.

    Args:
        net: the network, e.g. ``SemiSupervisedICL(InContextEigenmap(), GDICLHead())`` (ORIG+E2E-ICL, default).
        label_ratios: evaluation ratios for validation and test (linked from the data module's
            ``eval_label_ratios`` by the CLI).
        n_points: episode size (linked from the data module), used to validate the ratios and the net.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        lr_schedule: ``"cosine"`` (linear warm-up, then cosine decay to 0 over the run) or ``"constant"``.
        warmup_steps: warm-up length of the cosine schedule.
        eig_reference: also compute the exact Laplacian eigenmap (EIG, App. D) in validation so the
            representation-metrics callback can report the alignment of the learned features with it.
    """

    def __init__(
        self,
        net: nn.Module | None = None,
        label_ratios: Sequence[float] = DEFAULT_LABEL_RATIOS,
        n_points: int = 100,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        lr_schedule: Literal["cosine", "constant"] = "cosine",
        warmup_steps: int = 100,
        eig_reference: bool = True,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net if net is not None else SemiSupervisedICL()
        check_int("n_points", n_points, minimum=2)
        check_label_ratios(label_ratios, n_points)
        net_n = getattr(self.net, "n_points", None)
        if net_n is not None and net_n != n_points:
            raise ConfigError(
                f"the net was built for n_points={net_n} but the data has n_points={n_points}; "
                f"set the representation's n_points to {n_points}"
            )
        rep = getattr(self.net, "representation", None)
        k = getattr(rep, "n_neighbors", None)
        if k is not None and not 1 <= k <= n_points - 1:
            raise ConfigError(
                f"n_neighbors={k} but episodes have only {n_points} points; choose 1 <= n_neighbors <= {n_points - 1}"
            )
        check_choice("lr_schedule", lr_schedule, ("cosine", "constant"))
        check_unique("label_ratios", check_nonempty("label_ratios", label_ratios, example="[0.1, 0.25]"))
        check_positive("lr", lr, hint="e.g. lr: 0.003")
        check_nonnegative("weight_decay", weight_decay, hint="0.0 disables it")
        check_int("warmup_steps", warmup_steps, minimum=0, hint="0 disables the warm-up")
        if not isinstance(eig_reference, bool):
            raise ConfigError(f"eig_reference={eig_reference!r} must be true or false")
        self.label_ratios = [float(r) for r in label_ratios]
        self.n_points = n_points
        self.val_acc = nn.ModuleDict({_slot(r): MeanMetric() for r in self.label_ratios})
        self.test_acc = nn.ModuleDict({_slot(r): MeanMetric() for r in self.label_ratios})
        self.test_majority = nn.ModuleDict({_slot(r): MeanMetric() for r in self.label_ratios})
        self.val_loss = MeanMetric()
        self._trained_steps: int | None = None

    # ---------------------------------------------------------------- core
    @staticmethod
    def episode_losses(logits: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """Eq. (4), negated, per episode: mean cross-entropy over that episode's ``n - m`` unlabeled points."""
        ce = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # (B, n)
        unl = (~labeled).float()
        return (ce * unl).sum(-1) / unl.sum(-1).clamp_min(1.0)

    @classmethod
    def unlabeled_loss(cls, logits: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """The training objective: Eq. (4) averaged over the episodes of the batch.

        Averaging per episode (not per token) keeps every episode's weight independent of its ``m``, which is
        also what makes ``k`` DDP ranks with ``b`` episodes each equal one process with ``k * b``.
        """
        return cls.episode_losses(logits, y, labeled).mean()

    def _labeled_mask(self, n_labeled: Tensor, n: int) -> Tensor:
        return torch.arange(n, device=n_labeled.device).unsqueeze(0) < n_labeled.unsqueeze(1)

    def forward(self, x: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        return self.net(x, y, labeled).logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        x, y = batch["x"], batch["y"]
        labeled = self._labeled_mask(batch["n_labeled"], x.shape[1])
        logits = self(x, y, labeled)
        loss = self.unlabeled_loss(logits, y, labeled)
        self.log("train/loss", loss, prog_bar=True)
        # Accuracy only on logging steps: it is cheap, but not free next to an 11k-parameter net.
        every = max(self.trainer.log_every_n_steps, 1)
        if (self.global_step + 1) % every == 0:
            with torch.no_grad():
                self.log("train/acc", (logits.argmax(-1) == y)[~labeled].float().mean())
        return loss

    def _sweep(self, batch: dict[str, Tensor]) -> tuple[Tensor, list[tuple[float, Tensor, Tensor, Tensor]]]:
        """Representation once, then the head at every label ratio: ``(features, [(r, logits, labeled, y)])``."""
        x, y = batch["x"], batch["y"]
        n = x.shape[1]
        features = self.net.represent(x)
        out = []
        for r in self.label_ratios:
            labeled = torch.zeros_like(y, dtype=torch.bool)
            labeled[:, : labeled_count(r, n)] = True
            out.append((r, self.net.classify(features, y, labeled), labeled, y))
        return features, out

    @staticmethod
    def _accuracy_parts(logits: Tensor, y: Tensor, labeled: Tensor) -> tuple[Tensor, Tensor]:
        """Per-episode accuracy on the unlabeled points, and the labeled-majority baseline's."""
        unl = (~labeled).float()
        acc = ((logits.argmax(-1) == y).float() * unl).sum(-1) / unl.sum(-1)
        # Majority vote of the labeled points (ties -> class 0): what a model learns from labels alone.
        lab = labeled.float()
        pos = (y.float() * lab).sum(-1) > 0.5 * lab.sum(-1)
        maj = ((y == pos.long().unsqueeze(-1)).float() * unl).sum(-1) / unl.sum(-1)
        return acc, maj

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Any]:
        features, sweep = self._sweep(batch)
        for r, logits, labeled, y in sweep:
            acc, _ = self._accuracy_parts(logits, y, labeled)
            metric = self.val_acc[_slot(r)]
            metric.update(acc)
            # Logging the Metric object: Lightning computes (synced across ranks) and resets it at epoch end.
            self.log(f"val/acc/{ratio_key(r)}", metric, on_step=False, on_epoch=True, prog_bar=r == 0.25)
            self.val_loss.update(self.episode_losses(logits, y, labeled))
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True)
        embeddings = {"model": features.detach()}
        if self.hparams.eig_reference:
            embeddings["eig"] = laplacian_eigenmap(batch["x"])
        return {"embeddings": embeddings, "labels": batch["y"]}

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Any]:
        features, sweep = self._sweep(batch)
        for r, logits, labeled, y in sweep:
            acc, maj = self._accuracy_parts(logits, y, labeled)
            key = _slot(r)
            self.test_acc[key].update(acc)
            self.test_majority[key].update(maj)
        return {"embeddings": {"model": features.detach()}, "labels": batch["y"]}

    def on_test_epoch_end(self) -> None:
        rows = []
        for r in self.label_ratios:
            key = _slot(r)
            acc = self.test_acc[key].compute()
            maj = self.test_majority[key].compute()
            # compute() already synced the ranks; sync_dist averages identical values (and keeps DDP quiet).
            self.log(f"test/acc/{ratio_key(r)}", acc, sync_dist=True)
            self.log(f"test/majority_acc/{ratio_key(r)}", maj, sync_dist=True)
            rows.append(
                {
                    "label_ratio": r,
                    "n_labeled": labeled_count(r, self.n_points),
                    "accuracy": float(acc),
                    "labeled_majority_accuracy": float(maj),
                }
            )
            self.test_acc[key].reset()
            self.test_majority[key].reset()
        if self.trainer.is_global_zero:
            self._write_results(rows)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Class probabilities of every point at every label ratio: ``probs (R, B, n, C)``, plus the inputs.

        ``labels`` are the episodes' labels; at ratio ``label_ratios[r]`` only the first
        ``round(r * n)`` of them were shown to the model.
        """
        features, sweep = self._sweep(batch)
        probs = torch.stack([logits.float().softmax(-1) for _, logits, _, _ in sweep])
        return {
            "x": batch["x"],
            "labels": batch["y"],
            "features": features,
            "label_ratios": torch.tensor(self.label_ratios),
            "probs": probs,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._trained_steps = checkpoint.get("global_step")

    # ---------------------------------------------------------------- outputs
    def _write_results(self, rows: list[dict[str, float]]) -> None:
        """``results.json`` / ``results.csv`` / figure next to the run's logs (rank 0 only)."""
        out_dir = Path(self.trainer.log_dir or self.trainer.default_root_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        net = self.net
        info = {
            "net": type(net).__name__,
            "representation": type(getattr(net, "representation", net)).__name__,
            "parameters": count_parameters(net),
            # A test run starts its own step counter at 0; report the training steps of the checkpoint.
            "trained_steps": int(self._trained_steps if self._trained_steps is not None else self.global_step),
            "checkpoint": str(self.trainer.ckpt_path) if self.trainer.ckpt_path else None,
            "datamodule": _datamodule_summary(self.trainer.datamodule),
            "results": rows,
        }
        (out_dir / "results.json").write_text(json.dumps(info, indent=2))
        with open(out_dir / "results.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        label = info["representation"]
        png = line_plot_png(
            x=[100 * r["label_ratio"] for r in rows],
            series={
                f"{label} + GD-ICL": [r["accuracy"] for r in rows],
                "labeled-majority baseline": [r["labeled_majority_accuracy"] for r in rows],
            },
            title="IC-SSL test accuracy vs label ratio",
            xlabel="labeled points (%)",
            ylabel="accuracy on unlabeled points",
        )
        (out_dir / "accuracy_vs_label_ratio.png").write_bytes(png.getvalue())
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                png.seek(0)
                image = pil_to_tensor(Image.open(png).convert("RGB"))
                logger.experiment.add_image("test/accuracy_vs_label_ratio", image, self.global_step)

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if self.hparams.lr_schedule == "constant":
            return opt
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup = min(self.hparams.warmup_steps, total // 2)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = (step - warmup) / max(total - warmup, 1)
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _datamodule_summary(dm: Any) -> dict[str, Any]:
    """The data settings that identify a result (manifolds, sizes, seed), if the data module exposes them."""
    if dm is None:
        return {}
    keys = ("train_manifolds", "val_manifolds", "test_manifolds", "n_points", "test_episodes", "data_seed")
    return {k: getattr(dm, k) for k in keys if hasattr(dm, k)}

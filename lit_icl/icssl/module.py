"""The IC-SSL LightningModule: the in-context semi-supervised loss (Eq. 4) and the label-ratio protocol.

Batches are dicts from :mod:`lit_icl.icssl.data`:

- training: ``x (B, n, d)``, ``y (B, n)`` and ``n_labeled (B,)``; the first ``n_labeled`` points of each
  episode are labeled (points are i.i.d., so the first ``m`` are a uniformly random subset);
- validation / test: ``x`` and ``y``; every batch is evaluated at every ratio of ``label_ratios`` with
  ``m = round(ratio * n)`` labeled points, on the same episodes, so the ratios are compared pairwise.

The representation never sees labels, so it is computed once per batch and the GD head is re-run per ratio.
``test`` produces tidy rows (metrics ``accuracy`` and ``balanced_accuracy``, coordinates ``label_ratio`` and
``n_labeled``) for the model's method and two label-only floors, and the accuracy-vs-label-ratio figure, which
:class:`lit_icl.core.results.ResultsWriter` writes. The floors:

- ``class_prior``: one constant class for every point, the majority class of the test distribution (the
  honest floor: on the cylinder about 0.79, since 79 % of its points are negative);
- ``labeled_majority``: per episode, the majority class of its ``m`` labeled points (a weaker floor: with 3
  labels it often picks the minority class).

Balanced accuracy (mean recall over the classes present among an episode's unlabeled points) scores both
floors near 1/C, whatever the class prior.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torchmetrics import Metric

from lit_icl.core.errors import ConfigError
from lit_icl.core.figures import line_figure
from lit_icl.core.module import ICLModule
from lit_icl.core.nets import count_parameters
from lit_icl.core.optim import fused_if_cuda
from lit_icl.core.protocols import contract_summary, data_refusal, implements, unmet
from lit_icl.core.results import result_row
from lit_icl.core.spectral import laplacian_eigenmap
from lit_icl.core.validation import (
    check_bool,
    check_int,
    check_literal,
    check_nonnegative,
    check_positive,
)
from lit_icl.icssl.contracts import ICSSLDataModule, ICSSLNet, TwoStageNet
from lit_icl.icssl.data import (
    balanced_accuracy,
    labeled_count,
    labeled_mask,
    ratio_key,
)
from lit_icl.icssl.nets import SemiSupervisedICL
from lit_icl.metrics.mean import SyncFreeMean

#: The paper's names of the representations (Sec. 4.1), used as the ``method`` of result rows.
METHOD_NAMES = {
    "InContextEigenmap": "ORIG+E2E-ICL",
    "LaplacianEigenmap": "EIG+ICL",
    "RawCoordinates": "ORIG+ICL",
}


class ConstantPredictorStats(Metric):
    """Accuracy and balanced accuracy of every constant predictor "class c", accumulated over episodes.

    ``compute()`` returns those of the best constant (the majority class of the evaluated points), i.e. the
    ``class_prior`` floor, which is only known once all episodes are seen.
    """

    full_state_update = False

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes
        self.add_state("share", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("balanced", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("episodes", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, y: Tensor, mask: Tensor) -> None:
        onehot = F.one_hot(y, self.num_classes).double() * mask.unsqueeze(-1).double()  # (B, n, C)
        support = onehot.sum(1)  # (B, C)
        self.share += (support / support.sum(-1, keepdim=True).clamp_min(1.0)).sum(0)
        present = support > 0
        self.balanced += (present.double() / present.sum(-1, keepdim=True).clamp_min(1)).sum(0)
        self.episodes += y.shape[0]

    def compute(self) -> tuple[Tensor, Tensor]:
        best = int(self.share.argmax())
        n = self.episodes.clamp_min(1.0)
        return (self.share[best] / n).float(), (self.balanced[best] / n).float()


#: The per-ratio test series kept as SyncFreeMeans: ``<who>-<metric>``.
_TEST_SERIES = ("model-accuracy", "model-balanced_accuracy", "majority-accuracy", "majority-balanced_accuracy")


#: The data part of the name, for heads other than the GD ICL head (e.g. ``EIG`` + ``LR``).
DATA_NAMES = {"InContextEigenmap": "ORIG+E2E", "LaplacianEigenmap": "EIG", "RawCoordinates": "ORIG"}


LRSchedule = Literal["cosine", "constant"]


def _slot(ratio: float) -> str:
    """A ``ModuleDict`` key for a ratio's metric (module names cannot contain dots)."""
    return ratio_key(ratio).replace(".", "_")


class ICSSLModule(ICLModule):
    """Trains an IC-SSL net with the semi-supervised cross-entropy of Eq. (4) on the unlabeled points.

    Episode size and evaluation label ratios belong to the data module alone (its ``eval_label_ratios``, checked
    there); :meth:`bind_datamodule` reads them, and the nets check themselves against the data.

    Args:
        net: the network, e.g. ``SemiSupervisedICL(InContextEigenmap(), GDICLHead())`` (ORIG+E2E-ICL, default).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        lr_schedule: ``"cosine"`` (linear warm-up, then cosine decay to 0 over the run) or ``"constant"``.
        warmup_steps: warm-up length of the cosine schedule.
        eig_reference: also compute the exact Laplacian eigenmap (EIG, App. D) in validation so the
            representation-metrics callback can report the alignment of the learned features with it.
    """

    precisions = ("32-true", "64-true", "bf16-true", "bf16-mixed", "16-mixed")
    precisions_why = ("in fp16 its training loss is NaN at the first step")

    def __init__(
        self,
        net: nn.Module | None = None,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        lr_schedule: LRSchedule = "cosine",
        warmup_steps: int = 100,
        eig_reference: bool = True,
    ):
        super().__init__()
        self.save_reloadable_hparams()
        self.net = net if net is not None else SemiSupervisedICL()
        self._validate(self.net, lr, weight_decay, lr_schedule, warmup_steps, eig_reference)
        self.n_points: int | None = self.net.n_points
        #: The data module's ``eval_label_ratios`` (set by :meth:`bind_datamodule`; one metric each).
        self.label_ratios: list[float] = []
        self.num_classes: int = int(self.net.num_classes)
        self.labeled_subset = "random"
        self.dataset_size: int | None = None
        #: Names of the data's separate test sets (one per test manifold), ``[None]`` for a single test set.
        self.test_sets: list[str | None] = [None]
        self.val_acc = nn.ModuleDict()
        # Per ratio: accuracy and balanced accuracy of the model and of the labeled-majority vote.
        self.test_metrics = nn.ModuleDict()
        self.test_prior = nn.ModuleDict()
        self.val_loss = SyncFreeMean()
        #: What ``validation_step`` returns under ``embeddings`` (lets RepresentationMetrics check its pairs early).
        base = ("model", "eig") if eig_reference else ("model",)
        self.embedding_names = {"val": base, "test": base}
        #: Validation batch index -> (its points, their EIG reference), see :meth:`val_eig_reference`.
        self._val_eig: dict[int, tuple[Tensor, Tensor]] = {}

    @staticmethod
    def _validate(
        net: nn.Module, lr: float, weight_decay: float, lr_schedule: str, warmup_steps: int, eig_reference: bool
    ) -> None:
        """The constructor's argument checks, each message naming the option as the user wrote it."""
        if not implements(net, ICSSLNet):
            raise ConfigError(
                f"net {type(net).__name__} is not an IC-SSL net: {'; '.join(unmet(net, ICSSLNet))} (a net of your own "
                f"needs {contract_summary(ICSSLNet)}: lit_icl.icssl.contracts.ICSSLNet); or use "
                "lit_icl.icssl.SemiSupervisedICL"
            )
        check_literal("lr_schedule", lr_schedule, LRSchedule)
        check_positive("lr", lr, hint="e.g. lr: 0.003")
        check_nonnegative("weight_decay", weight_decay, hint="0.0 disables it")
        check_int("warmup_steps", warmup_steps, minimum=0, hint="0 disables the warm-up")
        check_bool("eig_reference", eig_reference)

    def _set_label_ratios(self, ratios: Sequence[float]) -> None:
        """One accuracy metric per ratio (torchmetrics states are not checkpointed, so this is free to redo)."""
        self.label_ratios = [float(r) for r in ratios]
        self.val_acc.clear()
        self.val_acc.update({_slot(r): SyncFreeMean() for r in self.label_ratios})
        self.test_metrics.clear()
        self.test_metrics.update({
            f"{i}-{_slot(r)}-{name}": SyncFreeMean()
            for i in range(len(self.test_sets)) for r in self.label_ratios for name in _TEST_SERIES
        })
        self.test_prior.clear()
        self.test_prior.update({
            f"{i}-{_slot(r)}": ConstantPredictorStats(self.num_classes)
            for i in range(len(self.test_sets)) for r in self.label_ratios
        })

    def validation_keys(self) -> set[str]:
        return {f"val/acc/{ratio_key(r)}" for r in self.label_ratios} | {"val/loss"}

    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """Take ``n_points``, ``eval_label_ratios`` and the test sets from the data (which checked them)."""
        if not implements(datamodule, ICSSLDataModule):
            raise data_refusal(datamodule, ICSSLDataModule, "ICSSLModule", "lit_icl.icssl.ManifoldDataModule")
        # The nets check themselves against the data (`check_config`, called by the CLI before a run starts).
        self.n_points = datamodule.n_points
        self.labeled_subset = datamodule.labeled_subset
        # Data with a fixed pool of training episodes (Sec. 4.2's "dataset size") tags the rows with it.
        size = datamodule.train_episodes
        self.dataset_size = int(size) if size is not None else None
        self.test_sets = list(datamodule.test_set_names or [None])
        self._set_label_ratios(datamodule.eval_label_ratios)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Outside ``fit``, the rows' ``dataset_size`` is what the weights were trained on: the checkpoint's own data
        settings, not the test command's (which need not repeat ``--data.init_args.train_episodes``, and may test
        on another data module). A resumed fit keeps its data module's, which it goes on training with."""
        super().on_load_checkpoint(checkpoint)
        data = checkpoint.get("datamodule_hyper_parameters")
        fitting = self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING
        if data is not None and not fitting:
            size = data.get("train_episodes")
            self.dataset_size = int(size) if size is not None else None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if not self.label_ratios:
            raise ConfigError(
                "ICSSLModule reads its label ratios from its data module, and has none; run it with an IC-SSL data "
                "module (trainer.fit(model, datamodule=lit_icl.icssl.ManifoldDataModule(...)))"
            )

    def compile_targets(self) -> list[nn.Module]:
        """The training step's :attr:`training_objective`, the net, and a two-stage net's representation and head.

        The training step calls the net and its loss as one module: compiled, it is one graph forward and one
        backward (the compiled net and parts inside it are traced into it), where the parts alone make two of
        each and the loss runs eager. Each compiled call costs host time of its own, which a step under CUDA
        graphs waits on: guards and autograd wrappers, and on a GPU the replay's bookkeeping
        (``benchmarks/compiled_regions.py``: 37-73 us less per step on our CPU machine for one region instead of
        two). Evaluation calls the parts one by one, the head once per label ratio (:meth:`_sweep`), or the whole
        net per ratio when it has no parts, so those are compiled on their own too.
        """
        parts = [self.net.representation, self.net.head] if implements(self.net, TwoStageNet) else []
        return [*super().compile_targets(), *parts]

    def representation(self, batch: dict[str, Tensor], net: nn.Module | None = None) -> Tensor:
        """The features ``(B, n, k)`` a net (default: this model's) gives the points of ``batch``.

        Label-aware nets (the Transformer baseline) see the labels of the smallest evaluation ratio. The
        representation-metrics callback calls it with the nets of other checkpoints (``compare_checkpoints``)
        to align them with this model on the same episodes (Sec. 4.2, Table 1).
        """
        net = self.net if net is None else net
        x, y = batch["x"], batch["y"]
        if implements(net, TwoStageNet):
            return net.represent(x)
        labeled = labeled_mask(y, labeled_count(min(self.label_ratios), x.shape[1]), self.labeled_subset)
        return net(x, y, labeled).features

    @property
    def method(self) -> str:
        """The paper's ``[Data+Model]`` name of this model (Sec. 4.1), else the class names.

        A net may name itself (``method`` attribute, e.g. the Transformer baseline); a head other than the GD
        ICL head names the model part (``method_suffix``: ``LR``, ``RBF-LR``) after the data part.
        """
        if isinstance(getattr(self.net, "method", None), str):
            return self.net.method
        if not implements(self.net, TwoStageNet):
            return type(self.net).__name__
        rep = self.net.representation
        suffix = getattr(self.net.head, "method_suffix", None)  # optional: the GD ICL head has none
        if suffix is not None:
            data = DATA_NAMES.get(type(rep).__name__, type(rep).__name__)
            return f"{data}+{suffix}"
        return METHOD_NAMES.get(type(rep).__name__, type(rep).__name__)

    # ---------------------------------------------------------------- core
    @staticmethod
    def episode_losses(logits: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """Eq. (4), negated, per episode: mean cross-entropy over that episode's ``n - m`` unlabeled points."""
        # Tokens flattened to rows: the class axis stays contiguous (a transposed (B, C, n) input costs a copy in
        # the backward).
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y)  # (B, n)
        unl = (~labeled).float()
        return (ce * unl).sum(-1) / unl.sum(-1).clamp_min(1.0)

    @classmethod
    def training_loss(cls, out: Any, y: Tensor, labeled: Tensor) -> Tensor:
        """The loss of :attr:`training_objective` (the net, then this, as one compiled region): Eq. (4) of the
        net's logits (:meth:`unlabeled_loss`)."""
        return cls.unlabeled_loss(out.logits, y, labeled)

    @classmethod
    def unlabeled_loss(cls, logits: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """The training objective: Eq. (4) averaged over the episodes of the batch.

        Averaging per episode (not per token) keeps every episode's weight independent of its ``m``, which is
        also what makes ``k`` DDP ranks with ``b`` episodes each equal one process with ``k * b``.
        """
        return cls.episode_losses(logits, y, labeled).mean()

    def forward(self, x: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        return self.net(x, y, labeled).logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        x, y = batch["x"], batch["y"]
        labeled = labeled_mask(y, batch["n_labeled"], self.labeled_subset)
        loss, out = self.training_objective((x, y, labeled), (y, labeled))
        logits = out.logits
        self.log_loss("train/loss", loss)
        # Accuracy only on logging steps: it is cheap, but not free next to an 11k-parameter net.
        if self.logging_step:
            with torch.no_grad():
                self.log("train/acc", (logits.argmax(-1) == y)[~labeled].float().mean())
        return loss

    def _sweep(self, batch: dict[str, Tensor]) -> tuple[Tensor, list[tuple[float, Tensor, Tensor, Tensor]]]:
        """The net at every label ratio: ``(features, [(r, logits, labeled, y)])``.

        A two-stage net (``represent`` + ``classify``, Sec. 4.1) computes its label-free representation once
        and re-runs only the head per ratio. A net whose features see the labels (the Transformer baseline of
        App. G) runs whole per ratio; its features at the smallest ratio are returned.
        """
        if not self.label_ratios:  # set by bind_datamodule, which a Trainer calls; a call by hand has not
            raise ConfigError("the module has no label ratios to evaluate at: bind it to its data module first, "
                              "model.bind_datamodule(dm) (a Trainer does this in setup)")
        x, y = batch["x"], batch["y"]
        n = x.shape[1]
        masks = [labeled_mask(y, labeled_count(r, n), self.labeled_subset) for r in self.label_ratios]
        if implements(self.net, TwoStageNet):
            features = self.net.represent(x)
            out = [(r, self.net.classify(features, y, m), m, y) for r, m in zip(self.label_ratios, masks)]
            return features, out
        outputs = [self.net(x, y, m) for m in masks]
        out = [(r, o.logits, m, y) for r, o, m in zip(self.label_ratios, outputs, masks)]
        smallest = min(range(len(self.label_ratios)), key=lambda i: self.label_ratios[i])
        return outputs[smallest].features, out

    @staticmethod
    def _unlabeled_accuracy(pred: Tensor, y: Tensor, labeled: Tensor) -> Tensor:
        """Per-episode accuracy of ``pred`` on the unlabeled points, ``(B,)``."""
        unl = ~labeled
        return ((pred == y) & unl).float().sum(-1) / unl.float().sum(-1)

    def _accuracy_parts(self, logits: Tensor, y: Tensor, labeled: Tensor) -> dict[str, Tensor]:
        """Per-episode accuracy and balanced accuracy on the unlabeled points, of the model and of the
        labeled-majority vote (each ``(B,)``)."""
        unl = ~labeled
        pred = logits.argmax(-1)
        # Majority vote of the labeled points (ties -> the lowest class id): what labels alone suggest.
        counts = (F.one_hot(y, self.num_classes) * labeled.unsqueeze(-1)).sum(1)  # (B, C)
        vote = counts.argmax(-1, keepdim=True).expand_as(y)
        acc = self._unlabeled_accuracy
        return {
            "model-accuracy": acc(pred, y, labeled),
            "model-balanced_accuracy": balanced_accuracy(pred, y, unl, self.num_classes),
            "majority-accuracy": acc(vote, y, labeled),
            "majority-balanced_accuracy": balanced_accuracy(vote, y, unl, self.num_classes),
        }

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Any]:
        features, sweep = self._sweep(batch)
        for r, logits, labeled, y in sweep:
            # Only the model's accuracy is validated: the other parts cost launches a GPU round would wait on.
            acc = self._unlabeled_accuracy(logits.argmax(-1), y, labeled)
            metric = self.val_acc[_slot(r)]
            metric.update(acc)
            # Logging the Metric object: Lightning computes (synced across ranks) and resets it at epoch end.
            self.log(f"val/acc/{ratio_key(r)}", metric, on_step=False, on_epoch=True, prog_bar=r == 0.25)
            self.val_loss.update(self.episode_losses(logits, y, labeled))
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True)
        embeddings = {"model": features.detach()}
        if self.hparams.eig_reference:
            embeddings["eig"] = self.val_eig_reference(batch["x"], batch_idx)
        return {"embeddings": embeddings, "labels": batch["y"]}

    def val_eig_reference(self, x: Tensor, batch_idx: int) -> Tensor:
        """The EIG reference (App. D) of validation batch ``batch_idx``, computed once and reused.

        The validation episodes are the same every round (a pure function of their index), and the reference
        does not depend on the model. It is reused only when the batch's points are equal to those it was
        computed from, so it is always the same tensor :func:`laplacian_eigenmap` gives. Why: on a GPU,
        ``eigh`` of a batch of ``n x n`` Laplacians (``n`` > 32) runs one small solver call per episode, which
        costs more than the round's forward passes.
        """
        cached = self._val_eig.get(batch_idx)
        # torch.equal (False for another shape) reads one flag back from the device: one wait per batch.
        if cached is not None and cached[0].device == x.device and torch.equal(cached[0], x):
            return cached[1]
        eig = laplacian_eigenmap(x)
        self._val_eig[batch_idx] = (x.clone(), eig)
        return eig

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        features, sweep = self._sweep(batch)
        for r, logits, labeled, y in sweep:
            key = f"{dataloader_idx}-{_slot(r)}"  # one test set per test manifold (ManifoldDataModule)
            for name, values in self._accuracy_parts(logits, y, labeled).items():
                self.test_metrics[f"{key}-{name}"].update(values)
            self.test_prior[key].update(y, ~labeled)
        embeddings = {"model": features.detach()}
        if self.hparams.eig_reference:
            embeddings["eig"] = laplacian_eigenmap(batch["x"])
        return {"embeddings": embeddings, "labels": batch["y"]}

    def on_test_epoch_end(self) -> None:
        rows = []
        methods = {"model": self.method, "majority": "labeled_majority", "prior": "class_prior"}
        for (i, test_set), r in itertools.product(enumerate(self.test_sets), self.label_ratios):
            key = f"{i}-{_slot(r)}"
            coords = {"label_ratio": r, "n_labeled": labeled_count(r, self.n_points) if self.n_points else None}
            if test_set is not None:
                coords["manifold"] = test_set
            if self.dataset_size is not None:
                coords["dataset_size"] = self.dataset_size
            values = {}
            for series in _TEST_SERIES:
                metric = self.test_metrics[f"{key}-{series}"]
                values[series] = metric.compute()
                metric.reset()
            values["prior-accuracy"], values["prior-balanced_accuracy"] = self.test_prior[key].compute()
            self.test_prior[key].reset()
            # compute() already synced the ranks; sync_dist averages identical values (and keeps DDP quiet).
            where = "" if test_set is None else f"{test_set}/"
            self.log(f"test/acc/{where}{ratio_key(r)}", values["model-accuracy"], sync_dist=True)
            self.log(f"test/balanced_acc/{where}{ratio_key(r)}", values["model-balanced_accuracy"], sync_dist=True)
            self.log(f"test/majority_acc/{where}{ratio_key(r)}", values["majority-accuracy"], sync_dist=True)
            self.log(f"test/class_prior_acc/{where}{ratio_key(r)}", values["prior-accuracy"], sync_dist=True)
            for series, value in values.items():
                who, metric_name = series.split("-")
                rows.append(result_row(metric_name, value, method=methods[who], **coords))
        rows.append(result_row("parameters", count_parameters(self.net), method=self.method))
        self.test_rows = rows

    def test_figures(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Accuracy on the unlabeled points against the share of labeled points (Fig. 4)."""
        if any("manifold" in r for r in rows):  # one line per (method, test manifold)
            rows = [{**r, "method": f"{r['method']} ({r['manifold']})"} if "manifold" in r else r for r in rows]
        fig = line_figure(
            rows, "label_ratio", metric="accuracy", split="test", x_transform=lambda r: 100 * r,
            title="IC-SSL test accuracy vs label ratio", xlabel="labeled points (%)",
            ylabel="accuracy on unlabeled points",
        )
        balanced = line_figure(
            rows, "label_ratio", metric="balanced_accuracy", split="test", x_transform=lambda r: 100 * r,
            title="IC-SSL balanced accuracy vs label ratio", xlabel="labeled points (%)",
            ylabel="mean recall over classes (unlabeled points)",
        )
        return {"accuracy_vs_label_ratio": fig, "balanced_accuracy_vs_label_ratio": balanced}

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """Every point's class at every label ratio, as ``test`` scores it: ``pred (R, B, n)``, the ``logits`` and
        ``probs (R, B, n, C)``, plus the inputs.

        ``labels`` are the episodes' labels; at ratio ``label_ratios[r]`` only those where ``labeled[r]`` is
        True (``round(r * n)`` per episode) were shown to the model. ``pred`` is the logits' argmax, the class that
        ``test``'s accuracies count: the probabilities round a margin below float32's resolution near 0.5 to an
        exact tie (a point far from every labeled one has logits of about 1e-17), whose argmax is class 0 whatever
        the logits said. With one test set per test manifold, ``test_set`` names the batch's manifold.
        """
        features, sweep = self._sweep(batch)
        per_ratio = [logits.float() for _, logits, _, _ in sweep]
        logits = torch.stack(per_ratio)  # a copy: under CUDA graphs the head's output memory is reused, as below
        out: dict[str, Any] = {
            "x": batch["x"],
            "labels": batch["y"],
            # A copy: predict keeps every batch's output, and under CUDA graphs (--compile.mode reduce-overhead)
            # the representation's output memory is reused by the next batch's replay.
            "features": features.clone(),
            "label_ratios": torch.tensor(self.label_ratios),
            "pred": logits.argmax(-1),
            "logits": logits,
            "probs": torch.stack([ratio.softmax(-1) for ratio in per_ratio]),
            "labeled": torch.stack([labeled for _, _, labeled, _ in sweep]),
        }
        if self.test_sets[dataloader_idx] is not None:
            out["test_set"] = self.test_sets[dataloader_idx]
        return out

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay,
            **fused_if_cuda(self.parameters()),
        )
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

"""The CoQE classification LightningModule: L_mod + L_orig with scheduled logit noise, ICL/IWL evaluators.

One objective for both nets of :mod:`lit_icl.coqe.omniglot.nets` (CoQE paper Sec. 4.2, 5.2, App. C.2):

- :class:`~lit_icl.coqe.omniglot.nets.SequenceTransformer`: cross-entropy of the query's logits (Chan et al.);
- :class:`~lit_icl.coqe.omniglot.nets.CoQEClassifier`: ``L_mod + L_orig``, the cross-entropies of the modified logits
  (dynamic vectors for context classes, static otherwise, plus Gaussian noise during training on every class's
  query logit by default, or on the non-context classes only: the net's ``noise_on``) and of the static logits
  (to speed up learning of the static vectors; not used at test time).

Noise schedule (App. C.2): ``N(mu_0, 1)``, mean and standard deviation raised by 1 every 10^4 steps; one
:class:`NoiseSchedule` value (``noise: {mean0, std0, increment, interval, delay}`` in a config) holds it. In general
``k = max(0, floor((step - delay) / interval))``, ``mean = mean0 + increment * k``, ``std = std0 + increment * k``;
the public code's variant is ``noise: {std0: 3, delay: 10000}``.

Validation and test run two evaluators (dataloader 0: ICL, 1: IWL) and log ``val/acc/icl``, ``val/acc/iwl``
(``test/...`` likewise): the learning curves of Figs. 5 and 8 in TensorBoard. For CoQE they also log
``val/acc/iwl_static``, the static head alone on the IWL sequences, so an IWL that the modified logits hide
(context classes outbidding a well-learned static head) is always visible next to the evaluator. Both nets also
log ``val/iwl_context_wins``, the fraction of IWL queries (whose class is never in the context) answered with
a class that is in the context: where IWL is lost to the context path. ``test`` leaves tidy rows in
``self.test_rows`` and a bar chart in :meth:`test_figures` for the shared results writer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor, nn

from lit_icl.coqe.contracts import SequenceData, SequenceNet
from lit_icl.coqe.omniglot.data import EVALUATORS
from lit_icl.coqe.omniglot.nets import CoQEClassifier, SequenceLogits
from lit_icl.core.errors import ConfigError
from lit_icl.core.figures import bar_figure
from lit_icl.core.module import ICLModule
from lit_icl.core.nets import count_parameters
from lit_icl.core.optim import fused_if_cuda
from lit_icl.core.protocols import contract_summary, data_refusal, implements, unmet
from lit_icl.core.results import result_row
from lit_icl.core.seeding import make_generator
from lit_icl.core.transfer import to_device
from lit_icl.core.validation import check_int, check_literal, check_nonnegative, check_positive, check_range
from lit_icl.metrics.mean import SyncFreeMean

#: Learning-rate schedules: the paper's constant rate, or Chan et al.'s linear warm-up then 1/sqrt(step).
LRSchedule = Literal["constant", "warmup_rsqrt"]


@dataclass(frozen=True)
class NoiseSchedule:
    """The Gaussian noise CoQE adds to the modified query logits during training (Sec. 4.2, App. C.2).

    At step ``t`` the noise is ``N(mean, std^2)`` with ``k = max(0, floor((t - delay) / interval))``,
    ``mean = mean0 + increment * k`` and ``std = std0 + increment * k``: it grows so that the static (in-weight)
    logits of the classes outside the context are ever more unreliable, which keeps the model reading the context.

    Attributes:
        mean0: mu_0, the mean at the start (5 in the paper; Table 1 ablates 3, 7 and 9).
        std0: the standard deviation at the start (1 in the paper, 3 in the public code).
        increment: added to mean and standard deviation at every increase (1).
        interval: training steps between increases (10^4).
        delay: steps before the schedule starts counting (0 in the paper; 10^4 in the public code, whose first
            increase thus comes after 2 x 10^4 steps).
    """

    mean0: float = 5.0
    std0: float = 1.0
    increment: float = 1.0
    interval: int = 10_000
    delay: int = 0

    def at(self, step: int) -> tuple[float, float]:
        """``(mean, std)`` of the logit noise at training step ``step``."""
        k = max(0, (step - self.delay) // self.interval)
        return self.mean0 + self.increment * k, self.std0 + self.increment * k

    def check(self, name: str = "noise") -> None:
        """One ConfigError naming the first bad value (``noise.interval=0 ...``)."""
        check_range(f"{name}.mean0", self.mean0)  # any finite mean; `noise: null` turns the noise off
        check_nonnegative(f"{name}.std0", self.std0)
        check_nonnegative(f"{name}.increment", self.increment)
        check_int(f"{name}.interval", self.interval, minimum=1, hint="steps between noise increases")
        check_int(f"{name}.delay", self.delay, minimum=0)


class CoQEClassificationModule(ICLModule):
    """Trains a sequence classifier on bursty/Zipfian sequences; evaluates ICL and IWL (Sec. 5.2).

    Args:
        net: :class:`~lit_icl.coqe.omniglot.nets.CoQEClassifier` (default) or
            :class:`~lit_icl.coqe.omniglot.nets.SequenceTransformer`; its ``n_classes`` must equal the data's
            training classes (checked at setup).
        lr: Adam learning rate (1e-4, App. C.2).
        lr_schedule: ``constant`` (App. C.2) or ``warmup_rsqrt``, Chan et al.'s
            ``lr * min(step / warmup, sqrt(warmup / step))``.
        warmup_steps: warm-up of ``warmup_rsqrt``.
        noise: the schedule of the CoQE logit noise (:class:`NoiseSchedule`; the paper's N(5, 1) growing by 1
            every 10^4 steps by default); ``null`` trains without noise (Table 1's noise-free row).
        noise_seed: seed of the noise; the noise of a step is a function of (seed, rank, step), so resume is exact.
    """

    precisions = ("32-true", "bf16-mixed", "16-mixed")
    precisions_why = ("its step builds the images and the label noise in float32")

    def __init__(
        self,
        net: nn.Module | None = None,
        lr: float = 1e-4,
        lr_schedule: LRSchedule = "constant",
        warmup_steps: int = 4000,
        noise: NoiseSchedule | None = NoiseSchedule(),
        noise_seed: int = 0,
    ):
        super().__init__()
        self.save_reloadable_hparams()
        if isinstance(noise, Mapping):  # saved hyper-parameters hold the schedule as plain values
            noise = NoiseSchedule(**noise)
        #: The logit-noise schedule, ``None`` for noise-free training.
        self.noise_schedule = noise
        self.net = net if net is not None else CoQEClassifier()
        self._validate(lr, lr_schedule, warmup_steps)
        self.method: str = self.net.method
        self.uses_noise = self.method == "coqe" and noise is not None
        #: Accuracies reported: the two evaluators, plus CoQE's static head on the IWL sequences.
        self.evaluators: tuple[str, ...] = EVALUATORS + (("iwl_static",) if self.method == "coqe" else ())
        self.acc = nn.ModuleDict(
            {f"{stage}_{ev}": SyncFreeMean() for stage in ("val", "test") for ev in self.evaluators}
        )
        self.context_wins = nn.ModuleDict({stage: SyncFreeMean() for stage in ("val", "test")})
        #: Image source the model was trained/tested on (``omniglot`` or ``glyphs``), from the data module.
        self.data_source: str | None = None
        self._data_coords: dict[str, Any] = {}

    def _validate(self, lr: float, lr_schedule: str, warmup_steps: int) -> None:
        """Every argument check of the constructor, one ConfigError naming the option and the fix."""
        if not implements(self.net, SequenceNet) or self.net.method not in ("coqe", "transformer"):
            # The losses, noise and evaluators are chosen by `method`, so it must be one of the two.
            problems = unmet(self.net, SequenceNet) or [f"method is {self.net.method!r}, not 'coqe' or 'transformer'"]
            raise ConfigError(
                f"net {type(self.net).__name__} is not a sequence classifier: {'; '.join(problems)} (a net of your "
                f"own needs {contract_summary(SequenceNet)}: lit_icl.coqe.contracts.SequenceNet); or use "
                "lit_icl.coqe.CoQEClassifier or lit_icl.coqe.SequenceTransformer"
            )
        check_positive("lr", lr, hint="1e-4 in App. C.2")
        check_literal("lr_schedule", lr_schedule, LRSchedule)
        check_int("warmup_steps", warmup_steps, minimum=1)
        if self.noise_schedule is not None:
            self.noise_schedule.check()

    # ---------------------------------------------------------------- data binding
    def validation_keys(self) -> set[str]:
        # The static head's accuracy exists only for a net with one (CoQE, not the Transformer).
        static = {"val/acc/iwl_static"} if getattr(self.net, "method", None) == "coqe" else set()
        return {"val/acc/icl", "val/acc/iwl", "val/iwl_context_wins"} | static

    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """The net takes its output size from the data's training classes (a different explicit count is an
        error); record the source and the data axes."""
        if not implements(datamodule, SequenceData):
            raise data_refusal(datamodule, SequenceData, "CoQEClassificationModule",
                               "lit_icl.coqe.OmniglotSequenceDataModule")
        self.net.set_n_classes(int(datamodule.n_labels))
        self.data_source = datamodule.source
        hp = datamodule.hparams
        self._data_coords = {k: float(hp[k]) for k in ("p_bursty", "zipf_alpha") if k in hp}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["coqe_data_source"] = self.data_source
        checkpoint["coqe_n_classes"] = self.net.n_classes

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Lightning calls this before loading the weights: a net whose class count came from the data module
        (``n_classes: null`` in the saved config) is built with the checkpoint's count first."""
        super().on_load_checkpoint(checkpoint)
        self.data_source = checkpoint.get("coqe_data_source", self.data_source)
        if self.net.n_classes is None:
            n = checkpoint.get("coqe_n_classes")
            if n is None:  # checkpoints written before the count was stored: read it off the label table
                n = checkpoint["state_dict"]["net.embed.label_embedding.weight"].shape[0]
            self.net.set_n_classes(int(n))

    def forward(self, images: Tensor, context_labels: Tensor) -> SequenceLogits:
        """The net's logits for sequences of ``images`` whose context carries ``context_labels`` (no logit noise:
        that is a training device), as ``model(images, labels[:, :-1])`` in a notebook."""
        return self.net(images, context_labels)

    # ---------------------------------------------------------------- training
    def noise(self, batch_size: int, device: torch.device) -> Tensor | None:
        """Noise ``(B, C)`` for this step's modified query logits, or ``None`` (Transformer / noise-free)."""
        if not self.uses_noise:
            return None
        mean, std = self.noise_schedule.at(self.global_step)
        g = make_generator("coqe-logit-noise", self.hparams.noise_seed, self.global_rank, self.global_step)
        z = torch.randn(batch_size, self.net.n_classes, generator=g)
        # Made on the host (the same numbers on any device) and sent from pinned memory, so the host does not wait
        # for the device's queue to drain before sending it (lit_icl.core.transfer).
        return to_device(mean + std * z, device)

    @staticmethod
    def query_losses(out: SequenceLogits, y: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(L_mod, L_orig)`` of the query (Sec. 4.2): the cross-entropy of the logits the net predicts with, and
        for CoQE that of its static logits (``None`` for the Transformer)."""
        mod = F.cross_entropy(out.logits[:, -1].float(), y)
        orig = None if out.static_logits is None else F.cross_entropy(out.static_logits[:, -1].float(), y)
        return mod, orig

    @classmethod
    def training_loss(cls, out: SequenceLogits, y: Tensor) -> Tensor:
        """``L_mod + L_orig`` (the Transformer: ``L_mod``). The loss of :attr:`training_objective`: the net and this
        as one module (one compiled region)."""
        mod, orig = cls.query_losses(out, y)
        return mod if orig is None else mod + orig

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        labels = batch["labels"]
        y = labels[:, -1]
        net_args = (batch["images"], labels[:, :-1], self.noise(len(y), labels.device))
        loss, out = self.training_objective(net_args, (y,))
        # The parts of the loss, the noise level and the accuracy go to the loggers on logging steps only
        # (``logging_step``: each ``self.log`` costs host time a GPU step would wait on). The parts are computed
        # again there, outside the compiled step, from the same logits: eager, they are the values summed above.
        logging = self.logging_step
        if logging and out.static_logits is not None:
            with torch.no_grad():
                loss_mod, loss_orig = self.query_losses(out, y)
            self.log("train/loss_mod", loss_mod)
            self.log("train/loss_orig", loss_orig)
            if self.uses_noise:
                mean, _ = self.noise_schedule.at(self.global_step)
                self.log("train/noise_mean", torch.tensor(mean))  # a host number: no copy to the device
        self.log_loss("train/loss", loss)
        if logging:
            self.log("train/acc", (out.logits[:, -1].argmax(-1) == y).float().mean())
        return loss

    # ---------------------------------------------------------------- evaluation
    def predictions(self, batch: dict[str, Tensor], evaluator: str) -> dict[str, Tensor]:
        """Predicted labels of the queries, ``{reported accuracy: (B,)}``.

        ICL: the modified logits over {0, 1}. IWL: the modified logits over all training labels, and for CoQE
        also the static head alone (``iwl_static``). No noise at evaluation.
        """
        labels = batch["labels"]
        out = self.net(batch["images"], labels[:, :-1])
        logits = out.logits[:, -1]
        if evaluator == "icl":
            return {"icl": logits[:, :2].argmax(-1)}
        preds = {"iwl": logits.argmax(-1)}
        if out.static_logits is not None:
            preds["iwl_static"] = out.static_logits[:, -1].argmax(-1)
        return preds

    def _eval_step(self, stage: str, batch: dict[str, Tensor], dataloader_idx: int) -> None:
        preds = self.predictions(batch, EVALUATORS[dataloader_idx])
        # Logged from the step, each under the loader (evaluator) it scores: Lightning then shows it in that loader's
        # column of its end-of-test table (logged at the epoch's end, a value is shown under every loader).
        for name, pred in preds.items():
            metric = self.acc[f"{stage}_{name}"]
            metric.update((pred == batch["labels"][:, -1]).float())
            self.log(
                f"{stage}/acc/{name}", metric, on_step=False, on_epoch=True,
                prog_bar=stage == "val" and name != "iwl_static", add_dataloader_idx=False,
            )
        if "iwl" in preds:  # is the predicted class one of the context's labels?
            wins = self.context_wins[stage]
            wins.update((preds["iwl"][:, None] == batch["labels"][:, :-1]).any(-1).float())
            self.log(f"{stage}/iwl_context_wins", wins, on_step=False, on_epoch=True, add_dataloader_idx=False)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("val", batch, dataloader_idx)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("test", batch, dataloader_idx)

    def on_test_epoch_end(self) -> None:
        rows = []
        coords = self.result_coordinates()
        # The metrics' values, synced across ranks; Lightning logs the same values (computed once, cached) and then
        # resets the metrics.
        for ev in self.evaluators:
            value = self.acc[f"test_{ev}"].compute()
            rows.append(result_row("accuracy", value, method=self.method, evaluator=ev, **coords))
        value = self.context_wins["test"].compute()
        rows.append(result_row("iwl_context_wins", value, method=self.method, evaluator="iwl", **coords))
        rows.append(result_row("parameters", count_parameters(self.net), method=self.method))
        self.test_rows = rows

    def result_coordinates(self) -> dict[str, Any]:
        """What identifies a result besides method and evaluator: source, E, L, P_bursty, alpha, mu_0."""
        net = self.net
        coords: dict[str, Any] = {"source": self.data_source}
        coords["emb_dim"] = getattr(net.embed.resnet, "feature_dim", None)
        coords["depth"] = len(net.encoder.blocks)
        coords.update(self._data_coords)
        if self.method == "coqe":
            # Named as in the results tables written before the schedule became one value.
            coords["noise_mean0"] = self.noise_schedule.mean0 if self.noise_schedule is not None else None
            coords["noise_on"] = net.noise_on
        return coords

    def test_figures(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``{"icl_vs_iwl": Figure}``: test accuracy per evaluator, one bar per method (Fig. 4's two axes)."""
        source = next((r.get("source") for r in rows if r.get("source")), None)
        fig = bar_figure(
            rows, "evaluator", metric="accuracy", split="test", ylabel="test accuracy",
            title=f"ICL vs IWL ({source})" if source else "ICL vs IWL",
        )
        fig.axes[0].set_ylim(0, 1.05)
        return {"icl_vs_iwl": fig}

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, **fused_if_cuda(self.parameters()))
        if self.hparams.lr_schedule == "constant":
            return opt
        warmup = self.hparams.warmup_steps

        def factor(step: int) -> float:
            s = step + 1
            return min(s / warmup, math.sqrt(warmup / s))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

"""The LightningModule of the corrupted-avMNIST experiment (Sec. 7, Table 1; App. I.1, I.5).

Cross-entropy on the logits of a net of :mod:`lit_icl.mmca.avmnist.nets`, AdamW (lr 3e-4, weight decay 1e-4).
After every training epoch the data module's validation loaders score the validation rows *and the test
split* (Table 1 reports each model's best test accuracy and the epoch it was reached); the module keeps that
per-epoch history in its checkpoints, so ``test --ckpt_path`` reports it as tidy rows:

- ``params``: trainable parameters (Table 1's first column);
- ``best_test_accuracy`` and ``best_epoch`` (1-based; ties keep the earlier epoch);
- ``test_accuracy`` per ``epoch`` and ``accuracy`` of the checkpoint being tested;
- every row carries ``noise_std`` (the corruption level) and ``dataset`` (the data folder's name).

``test_step`` returns the representation the head reads (``F_T[CLS]``, or the pooled streams of the baseline) as
``embeddings["cls"]`` with the digit labels, for :class:`~lit_icl.callbacks.representation.RepresentationMetrics`
(separation score by class, per test batch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.nets import count_parameters
from lit_icl.core.optim import fused_if_cuda
from lit_icl.core.protocols import contract_summary, data_refusal, implements, unmet
from lit_icl.core.results import result_row
from lit_icl.core.resume import training_position
from lit_icl.core.seeding import derive_seed
from lit_icl.core.validation import check_nonnegative, check_positive
from lit_icl.metrics.mean import SyncFreeMean
from lit_icl.mmca.avmnist.nets import MultimodalCrossAttention
from lit_icl.mmca.contracts import AVMNISTData, AVMNISTNet


class AVMNISTModule(ICLModule):
    """Trains a Table-1 net on corrupted avMNIST and reports Table 1's columns.

    Args:
        net: ``MultimodalCrossAttention(cross_attention=..., injection=...)`` or ``BidirectionalCrossAttention()``.
        lr: AdamW learning rate (3e-4). weight_decay: AdamW weight decay (1e-4).
    """

    #: What ``test_step`` returns under ``embeddings`` (lets RepresentationMetrics check its pairs early).
    embedding_names: ClassVar[dict[str, tuple[str, ...]]] = {"test": ("cls",)}

    def __init__(self, net: nn.Module | None = None, lr: float = 3e-4, weight_decay: float = 1e-4):
        super().__init__()
        self.save_reloadable_hparams()
        self.net = net if net is not None else MultimodalCrossAttention()
        if not implements(self.net, AVMNISTNet):
            raise ConfigError(
                f"{type(self.net).__name__} has no `represent` and `head`: {'; '.join(unmet(self.net, AVMNISTNet))} (a "
                f"net of your own needs {contract_summary(AVMNISTNet)}: lit_icl.mmca.contracts.AVMNISTNet); or use "
                "lit_icl.mmca.MultimodalCrossAttention or lit_icl.mmca.BidirectionalCrossAttention"
            )
        check_positive("lr", lr)
        check_nonnegative("weight_decay", weight_decay)
        self.method = str(getattr(self.net, "method", type(self.net).__name__))
        self.eval_splits: list[str] = ["val", "test"]
        self.noise_std: float | None = None
        self.dataset_name: str | None = None
        self.eval_acc = nn.ModuleDict({"val": SyncFreeMean(), "test": SyncFreeMean()})
        self.test_acc = SyncFreeMean()
        #: Test accuracy after each training epoch, in epoch order (restored from checkpoints).
        self.test_history: list[float] = []
        #: The training epoch of the last entry of ``test_history`` (``None``: not known, a checkpoint of older code).
        self._history_epoch: int | None = None
        self._rng_base = 0
        #: A checkpoint's dropout RNG states (and where in the data it was written), until training starts.
        self._restored_rng: dict[str, Any] | None = None
        self._rng_resumed_epoch: int | None = None

    # ---------------------------------------------------------------- wiring with the data
    def validation_keys(self) -> set[str]:
        # Each evaluated split is logged as "<split>/acc" at the end of validation ("val/acc" among them).
        return {f"{split}/acc" for split in self.eval_splits if split == "val"}

    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """Which split each validation loader scores, the corruption level and the data folder's name."""
        if not implements(datamodule, AVMNISTData):
            raise data_refusal(datamodule, AVMNISTData, "AVMNISTModule", "lit_icl.mmca.AVMNISTDataModule")
        if "test" not in datamodule.eval_splits:
            raise ConfigError("the data module's validation loaders must include the test split (Table 1)")
        self.eval_splits = list(datamodule.eval_splits)
        self.noise_std = float(datamodule.noise_std)
        self.dataset_name = Path(datamodule.root).name

    # ---------------------------------------------------------------- steps
    def forward(self, image: Tensor, audio: Tensor) -> Tensor:
        return self.net(image, audio)

    @staticmethod
    def training_loss(logits: Tensor, label: Tensor) -> Tensor:
        """Cross-entropy of the class logits (App. I.1). The loss of :attr:`training_objective`: the net and this
        as one module (one compiled region)."""
        return F.cross_entropy(logits, label)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, logits = self.training_objective((batch["image"], batch["audio"]), (batch["label"],))
        self.log_loss("train/loss", loss)
        if self.logging_step:  # each self.log costs host time: only on the steps the loggers write
            self.log("train/acc", (logits.argmax(-1) == batch["label"]).float().mean())
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.eval_splits[dataloader_idx]
        correct = (self(batch["image"], batch["audio"]).argmax(-1) == batch["label"]).float()
        self.eval_acc[split].update(correct)

    def on_validation_epoch_end(self) -> None:
        values = {split: self.eval_acc[split].compute() for split in self.eval_splits}  # synced over ranks
        for metric in self.eval_acc.values():
            metric.reset()
        if self.trainer.sanity_checking:
            return
        # compute() already synced the ranks, and every rank holds the same history: sync_dist averages identical
        # values and stops Lightning's warning under DDP that these are not accumulated across devices (they are).
        for split, value in values.items():
            self.log(f"{split}/acc", value, sync_dist=True)
        # One entry per training epoch: a round run when a run was stopped inside an epoch (``max_time``) is replaced
        # by the epoch's own round once a resumed run has finished it, as in a run that was never stopped.
        if self.test_history and self._history_epoch == self.current_epoch:
            self.test_history.pop()
        self.test_history.append(float(values["test"]))
        self._history_epoch = self.current_epoch
        best_epoch, best = self.best()
        self.log("test/best_acc", best, sync_dist=True)
        self.log("test/best_epoch", float(best_epoch), sync_dist=True)

    def best(self) -> tuple[int, float]:
        """``(epoch, accuracy)`` of the best test accuracy so far (1-based epoch; the earlier of ties)."""
        if not self.test_history:
            return 0, float("nan")
        acc = max(self.test_history)
        return self.test_history.index(acc) + 1, acc

    def on_test_epoch_start(self) -> None:
        self.test_acc.reset()
        self.test_rows = []

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Any]:
        h = self.net.represent(batch["image"], batch["audio"])
        logits = self.net.head(h)
        self.test_acc.update((logits.argmax(-1) == batch["label"]).float())
        return {"embeddings": {"cls": h.detach()}, "labels": batch["label"]}

    def on_test_epoch_end(self) -> None:
        acc = self.test_acc.compute()
        self.log("test/acc", acc, sync_dist=True)  # synced by compute(); sync_dist only quiets Lightning's warning
        coords: dict[str, Any] = {}
        if self.noise_std is not None:
            coords["noise_std"] = self.noise_std
        if self.dataset_name is not None:
            coords["dataset"] = self.dataset_name
        rows = [
            result_row("params", count_parameters(self.net), method=self.method, **coords),
            result_row("accuracy", float(acc), method=self.method, **coords),
        ]
        if self.test_history:
            best_epoch, best = self.best()
            rows.append(result_row("best_test_accuracy", best, method=self.method, **coords))
            rows.append(result_row("best_epoch", best_epoch, method=self.method, **coords))
            rows.append(result_row("epochs", len(self.test_history), method=self.method, **coords))
            rows += [
                result_row("test_accuracy", value, method=self.method, epoch=epoch, **coords)
                for epoch, value in enumerate(self.test_history, start=1)
            ]
        self.test_rows = rows

    # ---------------------------------------------------------------- dropout randomness
    def on_fit_start(self) -> None:
        self._rng_base = torch.initial_seed()  # seed_everything's seed, the same in a fresh and a resumed run

    def on_train_start(self) -> None:
        # A run resumed from a checkpoint written inside an epoch starts in that epoch without its
        # on_train_epoch_start: each rank continues from the RNG state it had when the checkpoint was written.
        restored, self._restored_rng = self._restored_rng, None
        if restored is not None and restored["batches"] > 0 and restored["epoch"] == self.current_epoch:
            self._set_dropout_rng(restored["states"])
            self._rng_resumed_epoch = self.current_epoch

    def on_train_epoch_start(self) -> None:
        # Dropout draws from the global RNG: re-seed it per epoch (and rank) so epoch e's masks are the same whether
        # the run started at epoch 0 or resumed from epoch e's checkpoint.
        if self._rng_resumed_epoch == self.current_epoch:  # resumed inside this epoch: its RNG state is restored
            self._rng_resumed_epoch = None
            return
        torch.manual_seed(derive_seed(self._rng_base, "avmnist_dropout", self.current_epoch, self.global_rank))

    def _dropout_rng_states(self) -> Tensor:
        """Every rank's global RNG state (the CPU generator's, then the CUDA device's on a GPU), one row per rank.
        A collective under DDP: Lightning writes checkpoints with every rank taking part."""
        mine = torch.get_rng_state()
        if self.device.type == "cuda":
            mine = torch.cat([mine, torch.cuda.get_rng_state(self.device)])
        if self.trainer.world_size == 1:
            return mine[None]
        return self.all_gather(mine.to(self.device)).cpu()

    def _set_dropout_rng(self, states: Tensor) -> None:
        if states.shape[0] != self.trainer.world_size:  # another number of ranks shards the data differently too
            return
        mine = states[self.global_rank]
        cpu = torch.get_rng_state().numel()
        torch.set_rng_state(mine[:cpu].clone())
        if self.device.type == "cuda" and mine.numel() > cpu:
            torch.cuda.set_rng_state(mine[cpu:].clone(), self.device)

    # ---------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["avmnist_test_history"] = list(self.test_history)
        checkpoint["avmnist_history_epoch"] = self._history_epoch
        if self._trainer is not None and self.trainer.state.fn == "fit":
            # Where in its data the run stands, and the dropout RNG there: a checkpoint written inside an epoch
            # resumes with the masks an uninterrupted run draws next (ResumableLoader resumes the batches).
            epoch, batches = training_position(self.trainer)
            checkpoint["avmnist_dropout_rng"] = {"epoch": epoch, "batches": batches,
                                                 "states": self._dropout_rng_states()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.test_history = list(checkpoint.get("avmnist_test_history", []))
        self._history_epoch = checkpoint.get("avmnist_history_epoch")
        self._restored_rng = checkpoint.get("avmnist_dropout_rng")

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay, **fused_if_cuda(params)
        )

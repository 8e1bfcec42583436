"""``EvaluationAtTrainedStep``: a ``test`` or ``validate`` of a checkpoint writes its scalars beside the fit's.

Such a run starts the trainer's step and epoch counters at 0, and Lightning writes the round's scalars at the step
counter, with the epoch beside them: TensorBoard showed every checkpoint's test at step 0 and epoch 0, away from the
validation curve of the fit that trained it. For the round this callback sets the counters where the fit wrote its
validation round of the same weights (Lightning writes a round after N optimizer steps at N - 1,
:func:`lit_icl.core.results.trained_step_x`; with several optimizers, as in I2CL, after N batches that stepped,
which the checkpoint records) and to the checkpoint's epoch, and puts them back after it. The rounds inside a fit
are left alone. The CLI adds it to every run.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from lit_icl.core.results import trained_step_x


class EvaluationAtTrainedStep(Callback):
    """Places a standalone evaluation round at the step and epoch of the weights it evaluates (see the module)."""

    def __init__(self) -> None:
        self._ckpt_epoch: int | None = None
        self._ckpt_x: int | None = None  # the step of the fit's round of the checkpoint's weights, when it says
        #: ``(step counter, epoch counter)`` as they were before the round, while it runs.
        self._saved: tuple[int, int] | None = None

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        epoch = checkpoint.get("epoch")
        self._ckpt_epoch = epoch if isinstance(epoch, int) else None
        # The fit wrote its scalars at its logging counter, which counts batches that stepped: the optimizer steps
        # (global_step) of one optimizer, but a third of them for I2CL's three methods, each with its own AdamW.
        loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
        stepped = loop.get("_batches_that_stepped") if isinstance(loop, dict) else None
        self._ckpt_x = max(stepped - 1, 0) if isinstance(stepped, int) else None

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._place(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:  # not the rounds inside a fit, which log at their own step
            self._place(trainer, pl_module)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore(trainer)

    def _place(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loop, progress = trainer.fit_loop.epoch_loop, trainer.fit_loop.epoch_progress.current
        self._saved = (loop._batches_that_stepped, progress.completed)
        loop._batches_that_stepped = trained_step_x(pl_module) if self._ckpt_x is None else self._ckpt_x
        if self._ckpt_epoch is not None:
            progress.completed = self._ckpt_epoch

    def _restore(self, trainer: Trainer) -> None:
        if self._saved is not None:
            trainer.fit_loop.epoch_loop._batches_that_stepped, trainer.fit_loop.epoch_progress.current.completed = (
                self._saved)
            self._saved = None
        self._ckpt_epoch = self._ckpt_x = None

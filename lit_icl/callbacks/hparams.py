"""``HParamsView``: each run's settings and metrics in TensorBoard's HPARAMS tab.

TensorBoard's HPARAMS tab lists runs by their hyper-parameters beside the last value of chosen metrics, which is
how one compares the seeds and settings of a sweep. Lightning's ``TensorBoardLogger`` fills it only together with
a metric that it writes itself: with ``default_hp_metric`` on, an ``hp_metric`` scalar of -1 at step 0 that a
module must overwrite, which the CLI turns off; so the tab stayed empty. This callback writes the tab's entry for
the run with the metrics the run really logs, and no scalar of its own: the module's validation metrics when a fit
starts (its ``validation_keys``, with ``train/loss``; what it logged when it ends, for a module that declares none),
and what a ``test`` or ``validate`` logged when it ends.
TensorBoard reads each metric's last value from the run's scalars.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn

#: What a hyper-parameter value may be in TensorBoard's tab; anything else is shown as its text.
_SHOWN = (bool, int, float, str)


def flat_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested settings as ``{"net/init_args/width": 16, ...}``: lists and other values as their text, ``None`` as
    ``"None"`` (the tab takes numbers, booleans and strings only); keys starting with ``_`` are left out."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in hparams.items():
        if str(key).startswith("_"):  # how the CLI rebuilds the module (_instantiator, _class_path), not a setting
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_hparams(value, f"{name}/"))
        else:
            flat[name] = value if isinstance(value, _SHOWN) else str(value)
    return flat


class HParamsView(Callback):
    """Writes the run's hyper-parameters (the module's and the data module's, as Lightning records them for
    ``hparams.yaml``, and the seed) to TensorBoard's HPARAMS tab with the metrics to show beside them (rank 0;
    other loggers are left alone). The CLI adds it to every run."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Written once per run (TensorBoard keeps the first entry it reads), so at the start, where a stopped fit
        # has its entry too; a module that declares no validation metrics (I2CL's) gets it at the end instead,
        # with what it logged.
        declared = getattr(pl_module, "validation_keys", lambda: None)()
        self._deferred = not declared
        if declared:
            self._write(trainer, {*declared, "train/loss"})

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.__dict__.pop("_deferred", False):
            self._write(trainer, trainer.logged_metrics)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write(trainer, trainer.logged_metrics)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:  # a fit's rounds are covered by its start
            self._write(trainer, trainer.logged_metrics)

    @staticmethod
    def _write(trainer: Trainer, metrics: Iterable[str]) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not trainer.is_global_zero or not loggers:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        tags = sorted(tag for tag in metrics if tag not in ("epoch", "step"))
        for logger in loggers:
            params = flat_hparams(dict(logger.hparams))
            seed = os.environ.get("PL_GLOBAL_SEED")
            if seed is not None:
                params.setdefault("seed_everything", int(seed))
            # Only the metrics' names are written: TensorBoard takes their values from the run's own scalars.
            experiment, start, end = hparams_summary(params, dict.fromkeys(tags, 0.0))
            writer = logger.experiment._get_file_writer()
            for summary in (experiment, start, end):
                writer.add_summary(summary)
            writer.flush()

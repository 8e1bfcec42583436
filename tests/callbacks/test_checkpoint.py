"""``RunCheckpoint`` writes ``last.ckpt`` at every epoch's save point and at the end of training, whatever its
top-k settings: Lightning 2.6 writes it only beside a top-k file, so with ``save_top_k: 0`` (I2CL's configs) a run
had no ``last.ckpt`` until it finished, and with ``every_n_train_steps`` only every N steps."""

from __future__ import annotations

import pytest
import torch
from coqe.regression.helpers import overlay, reg_args
from lightning.pytorch import Callback, LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI


class LastAtEpochStart(Callback):
    """The step of ``last.ckpt`` as each training epoch starts (``None`` before there is one)."""

    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        path = trainer.checkpoint_callback.last_model_path
        self.seen.append(torch.load(path, weights_only=True)["global_step"] if path else None)


@pytest.mark.parametrize("setting", [["--checkpoint.save_top_k", "0"], ["--checkpoint.every_n_train_steps", "7"]],
                         ids=["save_top_k_0", "every_7_steps"])
def test_last_is_written_at_every_epoch_end_and_at_the_last_step(tmp_path, setting: list[str]) -> None:
    args = reg_args(tmp_path, overlay("cpu"), "--data.init_args.train_batches_per_epoch", "5",
                    "--trainer.max_steps", "12", *setting)
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    spy = LastAtEpochStart()
    cli.trainer.callbacks.append(spy)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert spy.seen == [None, 5, 10]  # epochs of 5 steps
    last = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 12  # the steps after the last epoch's end are not lost


class RoundCounter(Callback):
    """Counts validation rounds, in the checkpoints (a stateful callback, as early stopping is)."""

    def __init__(self) -> None:
        self.rounds = 0

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.rounds += 1

    def state_dict(self) -> dict[str, int]:
        return {"rounds": self.rounds}


def test_last_written_every_n_steps_is_written_again_after_the_round_that_follows_it(tmp_path) -> None:
    """With ``every_n_train_steps`` the last step is saved at its batch's end, before the epoch's validation round:
    ``last.ckpt`` is written again after the round, so it holds what the round changed (callbacks' state, the
    module's per-epoch records), as it does without the setting."""
    args = reg_args(tmp_path, overlay("cpu"), "--data.init_args.train_batches_per_epoch", "5",
                    "--trainer.max_steps", "10", "--checkpoint.every_n_train_steps", "5")
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    counter = RoundCounter()
    cli.trainer.callbacks.append(counter)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    last = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=True)
    assert counter.rounds == 2 and last["global_step"] == 10
    assert last["callbacks"]["RoundCounter"] == {"rounds": 2}

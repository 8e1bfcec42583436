"""What the CLI adds to a built trainer (lit_icl/cli/trainer_setup.py): on a GPU, Lightning's default progress bar
is brought up to date on logging steps only; a bar a config gives keeps its settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader

from lit_icl.cli.trainer_setup import LoggingStepsRichBar, quiet_progress_bar

pytest.importorskip("rich")


class _Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_rich_bar_updates_on_logging_steps_and_at_the_epochs_last_batch(tmp_path, monkeypatch) -> None:
    updated: list[int] = []
    update = RichProgressBar.on_train_batch_end

    def record(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        updated.append(batch_idx)
        update(self, trainer, pl_module, outputs, batch, batch_idx)

    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", record)
    batches = [torch.randn(4, 2, generator=torch.Generator().manual_seed(i)) for i in range(10)]
    Trainer(accelerator="cpu", max_epochs=1, log_every_n_steps=4, logger=False, enable_checkpointing=False,
            enable_model_summary=False, callbacks=[LoggingStepsRichBar()],
            default_root_dir=tmp_path).fit(_Tiny(), DataLoader(batches, batch_size=None))
    assert updated == [3, 7, 9]


def _trainer(bar, device: str) -> SimpleNamespace:
    return SimpleNamespace(progress_bar_callback=bar, callbacks=[bar], log_every_n_steps=50,
                           strategy=SimpleNamespace(root_device=torch.device(device)))


@pytest.mark.parametrize(("bar", "device", "expected"), [
    (RichProgressBar(), "cuda", "LoggingStepsRichBar"),         # Lightning's default when rich is installed
    (TQDMProgressBar(), "cuda", "TQDMProgressBar every 50"),     # its default otherwise
    (RichProgressBar(leave=True), "cuda", "RichProgressBar"),   # a config's own bar stays as it is
    (TQDMProgressBar(refresh_rate=10), "cuda", "TQDMProgressBar every 10"),
    (RichProgressBar(), "cpu", "RichProgressBar"),              # on a CPU nothing changes
    (TQDMProgressBar(), "cpu", "TQDMProgressBar every 1"),
])
def test_on_an_accelerator_the_default_bars_wait_for_logging_steps(bar, device, expected) -> None:
    trainer = _trainer(bar, device)
    quiet_progress_bar(trainer)
    (now,) = trainer.callbacks
    name = type(now).__name__
    assert (f"{name} every {now.refresh_rate}" if name == "TQDMProgressBar" else name) == expected

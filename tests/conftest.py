"""Shared fixtures: tiny, fast IC-SSL configurations for CLI-level tests."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# In-process tests use one intra-op thread so they do not fight the subprocesses some tests start. Nothing is
# put into the environment: subprocesses run with the default thread count, as a user's run does.
torch.set_num_threads(1)


def tiny_args(tmp_path, *extra: str, name: str = "tiny", config: str = "configs/icssl_manifolds.yaml") -> list[str]:
    """CLI arguments for a seconds-long IC-SSL run (20-point episodes) logging under ``tmp_path``."""
    return [
        "--config", config,
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", name,
        "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.log_every_n_steps", "1",
        "--trainer.num_sanity_val_steps", "0",
        "--model.init_args.net.init_args.representation.init_args.n_points", "20",
        "--model.init_args.net.init_args.representation.init_args.stack_repeats", "1",
        "--data.init_args.n_points", "20",
        "--data.init_args.batch_size", "16",
        "--data.init_args.chunk_size", "8",
        "--data.init_args.eval_batch_size", "16",
        "--data.init_args.train_batches_per_epoch", "3",
        "--data.init_args.val_episodes", "16",
        "--data.init_args.test_episodes", "16",
        "--data.init_args.eval_label_ratios", "[0.1, 0.25, 0.5]",
        "--data.init_args.train_label_ratio", "[0.1, 0.5]",
        "--trainer.callbacks", "[]",
        *extra,
    ]


@pytest.fixture
def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch, repo_root: str) -> None:
    monkeypatch.chdir(repo_root)


class CrashAtEpoch(Callback):
    """Simulates a crash: raises at the start of epoch ``epoch``, after the previous epoch's checkpoint."""

    def __init__(self, epoch: int = 1):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("simulated crash")


class RecordBatches(Callback):
    """Debug aid: appends (epoch, global_step, batch checksum, lr) lines to ``path``."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        with open(self.path, "a") as fh:
            fh.write(f"{trainer.current_epoch} {trainer.global_step} {float(batch['x'].sum()):.6f} {lr:.8f}\n")



def tb_scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar a run logged to TensorBoard: ``{tag: [values in step order]}``."""
    out: dict[str, list[float]] = {}
    for path in sorted(glob.glob(str(Path(run_dir) / "events.out.tfevents.*"))):
        ea = EventAccumulator(path)
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in ea.Scalars(tag))
    return out

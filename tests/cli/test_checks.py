"""lit_icl.cli.checks: the DDP evaluation-set check counts the ranks that run, not the ones the flags ask for."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from lit_icl.cli.checks import check_eval_shards
from lit_icl.core.errors import ConfigError
from lit_icl.icssl import ManifoldDataModule


def torchrun_env(monkeypatch: pytest.MonkeyPatch, world_size: int) -> None:
    """The variables torchrun sets for rank 0 of ``world_size`` processes on one node."""
    for key, value in {"TORCHELASTIC_RUN_ID": "test", "WORLD_SIZE": world_size, "RANK": 0, "LOCAL_RANK": 0,
                       "GROUP_RANK": 0, "LOCAL_WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": 29555}.items():
        monkeypatch.setenv(key, str(value))


def trainer(devices: int) -> pl.Trainer:
    return pl.Trainer(devices=devices, strategy="ddp", accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False)


def test_under_torchrun_the_ranks_are_torchruns(monkeypatch) -> None:
    """torchrun started 2 ranks but the flags say 3 devices: 2 chunks split over the 2 ranks that run, so the check
    passes and Lightning's own start-up error names both numbers; it used to refuse the set for 3 ranks."""
    torchrun_env(monkeypatch, 2)
    dm = ManifoldDataModule(batch_size=16, val_episodes=32)
    check_eval_shards(trainer(3), dm, "fit")
    with pytest.raises(ConfigError, match="which 2 ranks cannot share evenly"):
        check_eval_shards(trainer(3), ManifoldDataModule(batch_size=16, val_episodes=48), "fit")


def test_without_a_launcher_the_ranks_are_the_flags() -> None:
    dm = ManifoldDataModule(batch_size=16, val_episodes=32)
    with pytest.raises(ConfigError, match="which 3 ranks cannot share evenly"):
        check_eval_shards(trainer(3), dm, "fit")
    check_eval_shards(trainer(2), dm, "fit")

"""Shared by the avMNIST tests: a tiny MultiBench-layout folder and the arguments of a seconds-long CLI run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import quiet_run_args


def write_layout(
    root: Path, n_train: int = 40, n_test: int = 20, audio_side: int = 112, seed: int = 0
) -> dict:
    """A tiny MultiBench-layout folder with random content; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "image/train_data.npy": rng.uniform(-60, 255, (n_train, 784)),
        "image/test_data.npy": rng.uniform(-60, 255, (n_test, 784)),
        "audio/train_data.npy": rng.integers(0, 256, (n_train, audio_side, audio_side)).astype(np.float64),
        "audio/test_data.npy": rng.integers(0, 256, (n_test, audio_side, audio_side)).astype(np.float64),
        "train_labels.npy": rng.integers(0, 10, n_train),
        "test_labels.npy": rng.integers(0, 10, n_test),
    }
    for name, arr in arrays.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / name, arr)
    return arrays


def avmnist_args(
    tmp_path: Path, root: Path, *extra: str, config: str | list[str] = "configs/mmca/avmnist.yaml"
) -> list[str]:
    """A seconds-long run on the layout under ``root``: depth 1, batch 16, 2 epochs."""
    return [
        *quiet_run_args(tmp_path, config),
        "--trainer.max_epochs", "2",
        "--model.init_args.net.init_args.depth", "1",
        "--data.init_args.root", str(root),
        "--data.init_args.val_size", "8",
        "--data.init_args.batch_size", "16",
        "--data.init_args.eval_batch_size", "10",
        *extra,
    ]  # fmt: skip

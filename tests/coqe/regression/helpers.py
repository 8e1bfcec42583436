"""Helpers of the CoQE regression tests."""

from __future__ import annotations

from pathlib import Path

from conftest import quiet_run_args

BASE = "configs/coqe/regression.yaml"


def overlay(*names: str) -> tuple[str, ...]:
    """The base and ``configs/coqe/regression/<name>.yaml`` for each name, in order."""
    return (BASE, *(f"configs/coqe/regression/{n}.yaml" for n in names))


def reg_args(tmp_path: Path, config: str | tuple[str, ...] = BASE, *extra: str, n: int = 8) -> list[str]:
    return [
        *quiet_run_args(tmp_path, config),
        "--trainer.accelerator", "cpu",
        "--trainer.max_steps", "4",
        "--trainer.log_every_n_steps", "1",
        "--model.init_args.net.init_args.width", "16",
        "--model.init_args.net.init_args.depth", "1",
        "--model.init_args.net.init_args.max_points", str(n),
        "--data.init_args.n_points", str(n),
        "--data.init_args.batch_size", "8",
        "--data.init_args.chunk_size", "4",
        "--data.init_args.train_batches_per_epoch", "2",
        "--data.init_args.val_prompts", "8",
        "--data.init_args.test_prompts", "8",
        "--data.init_args.eval_batch_size", "8",
        *extra,
    ]

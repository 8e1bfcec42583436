"""Shared by the IC-SSL tests: the shipped configs (each as the ``--config`` files of one run) and tiny runs."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from conftest import quiet_run_args

#: The experiments of configs/icssl/: a base ``<experiment>.yaml`` each, some with overlays in ``<experiment>/``.
EXPERIMENTS = ("manifolds", "product", "image_manifolds", "features")
MANIFOLDS = "configs/icssl/manifolds.yaml"
PRODUCT = "configs/icssl/product.yaml"




def overlay(experiment: str, variant: str) -> list[str]:
    """The ``--config`` files of one overlay run: the base, then the overlay."""
    return [f"configs/icssl/{experiment}.yaml", f"configs/icssl/{experiment}/{variant}.yaml"]


def experiment_configs(experiment: str) -> list[list[str]]:
    """``[[base], [base, overlay], ...]`` for ``configs/icssl/<experiment>.yaml`` and its overlays."""
    base = f"configs/icssl/{experiment}.yaml"
    return [[base]] + [[base, path] for path in sorted(glob.glob(f"configs/icssl/{experiment}/*.yaml"))]


def all_configs() -> list[list[str]]:
    """Every shipped IC-SSL run: each base alone and each overlay on its base."""
    return [files for experiment in EXPERIMENTS for files in experiment_configs(experiment)]


def config_id(files: Sequence[str]) -> str:
    """``manifolds`` for a base alone, ``manifolds+ood`` for a base with an overlay."""
    return "+".join(Path(f).stem for f in files)


def tiny_args(
    tmp_path: Path, *extra: str, name: str = "tiny", config: str | Sequence[str] = MANIFOLDS,
    config_callbacks: bool = False,
) -> list[str]:
    """CLI arguments for a seconds-long IC-SSL run (20-point episodes) logging under ``tmp_path``.

    ``config``: one config file or the files of a base and its overlay (``overlay("manifolds", "ood")``).
    ``config_callbacks``: keep the config's callbacks (representation metrics, the best-model checkpoint) rather
    than none.
    """
    return [
        *quiet_run_args(tmp_path, config, name),
        "--trainer.max_epochs", "2",
        "--trainer.log_every_n_steps", "1",
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
        *([] if config_callbacks else ["--trainer.callbacks", "[]"]),
        *extra,
    ]

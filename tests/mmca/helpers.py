"""Shared by the mmca tests: the shipped configs of an experiment, each as the ``--config`` files of one run."""

from __future__ import annotations

import glob
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

EXPERIMENTS = ("synthetic", "avmnist")


def experiment_configs(experiment: str) -> list[list[str]]:
    """``[[base], [base, overlay], ...]`` for ``configs/mmca/<experiment>.yaml`` and its overlays."""
    base = f"configs/mmca/{experiment}.yaml"
    return [[base]] + [[base, overlay] for overlay in sorted(glob.glob(f"configs/mmca/{experiment}/*.yaml"))]


def config_id(files: list[str]) -> str:
    """``synthetic`` for the base alone, ``synthetic+fig3_full`` for the base with an overlay."""
    return "+".join(Path(f).stem for f in files)




class SaveStateDict(Callback):
    """Saves the LightningModule's ``state_dict`` to ``path`` when ``test`` starts (after a checkpoint loaded), so a
    test can compare the weights a CLI run used with the checkpoint's."""

    def __init__(self, path: str):
        self.path = path

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        torch.save(pl_module.state_dict(), self.path)

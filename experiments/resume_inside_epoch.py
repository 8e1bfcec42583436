"""Does a run cut inside an epoch and resumed with ``--ckpt_path last`` end as a run that was never cut?

Tiny IC-SSL fits (20-point episodes, 3 epochs of 3 steps, its cosine schedule) on the CPU, each in its own process:
one uninterrupted run, and one cut after step ``--at`` and resumed. The cut is one of

- ``stop``: ``trainer.should_stop`` after that step, the way ``--trainer.max_time`` stops a run;
- ``kill``: SIGKILL after that step, with ``--checkpoint.every_n_train_steps 4`` (a checkpoint inside an epoch);
- ``workers``: ``stop`` with 2 DataLoader workers.

Prints the final step of both runs and whether their weights and optimizer states are bit-identical::

    python experiments/resume_inside_epoch.py --cuts stop kill workers
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "--config", "configs/icssl/manifolds.yaml", "--seed_everything", "7",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    "--trainer.num_sanity_val_steps", "0", "--trainer.max_epochs", "3", "--trainer.log_every_n_steps", "1",
    "--model.init_args.net.init_args.representation.init_args.n_points", "20",
    "--model.init_args.net.init_args.representation.init_args.stack_repeats", "1",
    "--data.init_args.n_points", "20", "--data.init_args.batch_size", "16", "--data.init_args.chunk_size", "8",
    "--data.init_args.eval_batch_size", "16", "--data.init_args.train_batches_per_epoch", "3",
    "--data.init_args.val_episodes", "16", "--data.init_args.eval_label_ratios", "[0.1, 0.25, 0.5]",
    "--data.init_args.train_label_ratio", "[0.1, 0.5]",
]


class CutAtStep(Callback):
    """After optimizer step ``step``: set ``should_stop`` (``kill=False``) or SIGKILL this process."""

    def __init__(self, step: int, kill: bool = False):
        self.step, self.kill = step, kill

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step == self.step:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            trainer.should_stop = True


def fit(root: Path, *extra: str) -> int:
    """``python -m lit_icl fit`` of the tiny config into ``root``; the exit code."""
    args = [*TINY, "--trainer.logger.init_args.save_dir", str(root / "runs"),
            "--trainer.logger.init_args.name", "run", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lit_icl", "fit", *args], cwd=REPO, env=env,
                          capture_output=True, check=False).returncode


def last(root: Path) -> dict:
    return torch.load(root / "runs/run/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)


def compare(cut: str, at: int) -> str:
    extra = {"stop": [], "kill": ["--checkpoint.every_n_train_steps", "4"],
             "workers": ["--data.init_args.num_workers", "2"]}[cut]
    callback = f'[{{"class_path": "resume_inside_epoch.CutAtStep", "init_args": {{"step": {at}, "kill": {str(cut == "kill").lower()}}}}}]'
    with tempfile.TemporaryDirectory() as tmp:
        straight, resumed = Path(tmp) / "straight", Path(tmp) / "resumed"
        fit(straight, *extra)
        fit(resumed, *extra, "--trainer.callbacks", callback)
        fit(resumed, *extra, "--ckpt_path", "last")
        a, b = last(straight), last(resumed)
    same = all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"]) and all(
        torch.equal(x[k], y[k]) for x, y in zip(a["optimizer_states"][0]["state"].values(),
                                                 b["optimizer_states"][0]["state"].values()) for k in x)
    return f"{cut:8s} cut after step {at}: final step {a['global_step']} uninterrupted, {b['global_step']} resumed; " \
           f"bit-identical: {same}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuts", nargs="+", choices=("stop", "kill", "workers"), default=["stop", "kill", "workers"])
    parser.add_argument("--at", type=int, default=5, help="the step after which the run is cut (epochs of 3 steps)")
    args = parser.parse_args(argv)
    for cut in args.cuts:
        print(compare(cut, args.at), flush=True)


if __name__ == "__main__":
    main()

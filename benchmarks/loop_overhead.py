"""Host time per training step that Lightning's loop adds to the module's own step, as the CLI runs it.

    python benchmarks/loop_overhead.py                                    # the main command's callbacks
    python benchmarks/loop_overhead.py --config configs/icssl/manifolds.yaml --repeats 7

Under CUDA graphs a small net's step is a few hundred microseconds of GPU work, and the host's time per step
decides the rate: Lightning reaches the speed issue's 0.95x of a bare loop only if what its loop adds stays
under 5 % of the step. This measures that addition without a GPU. A one-layer module (so the step itself is a
few microseconds) trains on batches made ahead, three ways:

- ``bare``: ``training_step``, ``backward``, the optimizer step and ``zero_grad`` in a Python loop;
- ``lightning defaults``: ``Trainer.fit`` with the callbacks the CLI gives the config's run, the module a plain
  ``LightningModule`` and Lightning's default profiler;
- ``as the CLI runs it``: the same trainer with what the CLI sets up (:func:`lit_icl.cli.trainer_setup.
  no_op_profiler`) and the module an :class:`~lit_icl.core.module.ICLModule`, as every paper's module is.

Lightning dispatches about 60 hooks per training step, each a callback or module method called with some
bookkeeping around it, and a callback costs its share at every hook whether or not it implements it; so the
addition grows with the number of callbacks. It prints microseconds per step (the best of ``--repeats`` runs)
and the additions over ``bare``. Validation, checkpoint writes and logging are left out (no validation, no
logger); the progress bar too, as ``main_command.py`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from bench_options import at_least
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.profilers import PassThroughProfiler
from torch import nn

from lit_icl.cli import LitICLCLI, process_defaults
from lit_icl.core.module import ICLModule

ROOT = Path(__file__).resolve().parents[1]


def _step(module: LightningModule, batch: torch.Tensor) -> torch.Tensor:
    return module.layer(batch).sum()


class PlainOneLayer(LightningModule):
    """A one-layer module: a step of a few microseconds, so what the loop adds is what is timed."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return _step(self, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class OneLayer(ICLModule):
    """:class:`PlainOneLayer` on the paper modules' base class."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    training_step = PlainOneLayer.training_step
    configure_optimizers = PlainOneLayer.configure_optimizers


class _Timer(Callback):
    """Seconds from the start of training batch ``first`` to the end of training."""

    def __init__(self, first: int) -> None:
        self.first, self.t0, self.seconds = first, 0.0, float("nan")

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.first:
            self.t0 = time.perf_counter()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.seconds = time.perf_counter() - self.t0


def cli_trainer(configs: list[str], root: str) -> Trainer:
    """The trainer the CLI builds for ``configs``: its callbacks and setup, no logger, no progress bar."""
    args = [a for c in configs for a in ("--config", c)] + [
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", root]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    return cli.trainer


def lightning_us(configs: list[str], cli_setup: bool, steps: int, warmup: int) -> float:
    """Microseconds per training step of a one-layer module fitted by the config's CLI trainer."""
    with tempfile.TemporaryDirectory() as root:
        template = cli_trainer(configs, root)
        callbacks = [c for c in template.callbacks if not isinstance(c, _Timer)]
        timer = _Timer(warmup)
        trainer = Trainer(
            accelerator="cpu", devices=1, max_steps=steps, max_epochs=-1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=root,
            enable_checkpointing=template.checkpoint_callback is not None, callbacks=[*callbacks, timer],
            profiler=template.profiler if cli_setup else PassThroughProfiler(),
        )
        module = OneLayer() if cli_setup else PlainOneLayer()
        batches = torch.utils.data.DataLoader([torch.ones(1, 1)] * steps, batch_size=None)
        # The run's own printing (the model summary, Lightning's messages) is not what this script reports.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            trainer.fit(module, train_dataloaders=batches)
        names = ", ".join(type(c).__name__ for c in callbacks)
        print(f"    callbacks: {names}; profiler: {type(trainer.profiler).__name__}", flush=True)
    return 1e6 * timer.seconds / (steps - warmup)


def bare_us(steps: int, warmup: int) -> float:
    """Microseconds per step of the same module in a plain loop."""
    module = PlainOneLayer()
    opt = module.configure_optimizers()
    batch = torch.ones(1, 1)
    t0 = 0.0
    for i in range(steps):
        if i == warmup:
            t0 = time.perf_counter()
        loss = module.training_step(batch, i)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return 1e6 * (time.perf_counter() - t0) / (steps - warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="a config file; repeat for overlays "
                        "(default: the main command's)")
    parser.add_argument("--steps", type=at_least(1), default=3000, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=at_least(0), default=300)
    parser.add_argument("--repeats", type=at_least(1), default=5, help="runs of each; the best is reported")
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error("--warmup must be smaller than --steps")
    os.chdir(ROOT)
    process_defaults()  # as python -m lit_icl does
    configs = args.config or ["configs/coqe_omniglot.yaml"]
    print(f"config: {' + '.join(configs)}  torch {torch.__version__}  threads {torch.get_num_threads()}  "
          f"steps timed: {args.steps - args.warmup} (after {args.warmup}), best of {args.repeats}", flush=True)
    # Interleaved repeats, so that a slow spell of a shared machine does not land on one variant only.
    runs: dict[str, list[float]] = {"bare": [], "lightning defaults": [], "as the CLI runs it": []}
    for _ in range(args.repeats):
        runs["bare"].append(bare_us(args.steps, args.warmup))
        runs["lightning defaults"].append(lightning_us(configs, False, args.steps, args.warmup))
        runs["as the CLI runs it"].append(lightning_us(configs, True, args.steps, args.warmup))
    best = {name: min(values) for name, values in runs.items()}
    for name, us in best.items():
        added = "" if name == "bare" else f"  (Lightning adds {us - best['bare']:.0f} us)"
        print(f"{name:20s}: {us:7.1f} us per step{added}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

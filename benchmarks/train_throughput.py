"""Training steps per second: Lightning path vs a bare PyTorch loop over the same net, data and optimiser.

    python benchmarks/train_throughput.py --config configs/icssl/manifolds.yaml --steps 150 --warmup 20

The config must be an IC-SSL one (other configs are refused; ``benchmarks/step_speed.py`` compares any config's,
on batches made ahead). Both paths build the model and data module from the same YAML through the project's CLI,
start from the same weights and do the same work per step: the bare loop calls ``ICSSLModule``'s own
``training_step`` (label mask, training objective, the values computed for logging on Lightning's logging steps)
and the optimizer and per-step LR schedule of its ``configure_optimizers`` (the config's cosine schedule), over
the loader ``Trainer.fit`` gets (epoch 0; pinned on a GPU), with the data module's transfer hooks; nothing is
copied from the module. ``tests/test_train_throughput.py`` checks that both paths end at the same weights, bit
for bit. Both clocks run from the end of step ``--warmup`` (with 0: the start of training) to the end of step
``--steps``, data fetching included, the device synchronised at both ends; each path is measured ``--repeats``
times, interleaved, and the best run is reported (the least disturbed by other work on the machine). The goal
tracked in the issues is ``lightning / bare >= 0.95``.

``--deterministic true|false`` (default true, as the CLI) turns deterministic kernels on or off for both paths;
run it both ways to see what reproducibility costs.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from bench_options import at_least
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device
from step_speed import _optimizer, _stub_trainer, _sync, bare_step
from torch.utils.data import DataLoader

from lit_icl.cli import LitICLCLI, process_defaults
from lit_icl.cli.trainer_setup import NoOpProfiler


class _StepTimer(Callback):
    """From the end of step ``warmup`` (with ``warmup`` 0: the start of training, the loader's iterator made) to the
    end of step ``steps``, steps counted from 1 as ``global_step`` counts them; the device synchronised at both."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.t0 = self.t1 = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        if self.warmup == 0:
            _sync(pl_module.device)
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step in (self.warmup, self.steps):
            _sync(pl_module.device)
            if trainer.global_step == self.warmup:
                self.t0 = time.perf_counter()
            else:
                self.t1 = time.perf_counter()


def _trainer(device: torch.device, deterministic: bool, **kwargs) -> Trainer:
    """A Trainer on ``device`` set up as the CLI's (its no-op profiler), without logger, checkpoints or progress bar."""
    return Trainer(
        deterministic=deterministic,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=NoOpProfiler(),  # the CLI's default (lit_icl.cli.trainer_setup.no_op_profiler)
        **kwargs,
    )


def lightning_steps_per_s(
    module: LightningModule, dm: LightningDataModule, warmup: int, steps: int, device: torch.device,
    deterministic: bool = True,
) -> float:
    timer = _StepTimer(warmup, steps)
    trainer = _trainer(device, deterministic, max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0,
                       callbacks=[timer])
    trainer.fit(module, datamodule=dm)
    if trainer.global_step != steps:
        raise RuntimeError(f"the Lightning run stopped after {trainer.global_step} of {steps} steps")
    return (steps - warmup) / (timer.t1 - timer.t0)


def training_loader(dm: LightningDataModule, device: torch.device, deterministic: bool) -> DataLoader:
    """The training loader ``Trainer.fit`` gets from ``dm`` on ``device``: made with a fresh Trainer attached, so at
    epoch 0 (not the epoch an earlier run's trainer, still attached, ended in) and pinned on a CUDA device as
    Lightning's is. Making that Trainer also sets torch's deterministic flags as a Lightning run sets them."""
    previous = dm.trainer
    dm.trainer = _trainer(device, deterministic)
    try:
        dm.prepare_data()
        dm.setup("fit")
        return dm.train_dataloader()
    finally:
        dm.trainer = previous


def bare_steps_per_s(
    module: LightningModule, dm: LightningDataModule, warmup: int, steps: int, device: torch.device,
    deterministic: bool = True,
) -> float:
    """``ICSSLModule``'s own training step without Lightning, timed as :class:`_StepTimer` times Lightning's.

    Per batch of the loader Lightning would get (:func:`training_loader`): the data module's transfer hooks, the
    module's ``training_step`` (its label mask, its training objective and, on the steps Lightning logs, the values
    it computes for logging), ``zero_grad``, ``backward``, the optimizer step and the per-step LR schedule, both from
    the module's ``configure_optimizers``. Nothing is copied from the module, so the loop cannot drift from it
    (``tests/test_train_throughput.py``: the two paths end at the same weights, bit for bit).
    """
    loader = training_loader(dm, device, deterministic)
    module = module.to(device).train()
    stub = _stub_trainer(steps)  # configure_optimizers reads estimated_stepping_batches: Lightning's max_steps
    module._trainer = stub  # type: ignore[assignment]  # attribute reads only
    module.log = lambda *args, **kwargs: None  # type: ignore[method-assign]  # logging is Lightning's part
    opt, sched = _optimizer(module.configure_optimizers())
    batches = iter(loader)
    _sync(device)
    t0 = time.perf_counter()  # with no warm-up, from the first fetch, as Lightning's clock
    for step in range(steps):
        try:
            batch = next(batches)
        except StopIteration:
            raise RuntimeError(f"the training loader ended after {step} of {steps} batches") from None
        batch = dm.on_after_batch_transfer(move_data_to_device(dm.on_before_batch_transfer(batch, 0), device), 0)
        bare_step(module, stub, opt, sched, batch, step)
        if step + 1 == warmup:
            _sync(device)
            t0 = time.perf_counter()
    _sync(device)
    elapsed = time.perf_counter() - t0
    module._trainer = None
    return (steps - warmup) / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/icssl/manifolds.yaml",
                        help="an IC-SSL config (the bare loop is IC-SSL's step)")
    parser.add_argument("--steps", type=at_least(1), default=150)
    parser.add_argument("--warmup", type=at_least(0), default=20)
    parser.add_argument("--repeats", type=at_least(1), default=2)
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--deterministic", choices=["true", "false"], default="true")
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error(f"--warmup must be smaller than --steps, got --warmup {args.warmup}, "
                     f"--steps {args.steps}")
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; pass --accelerator cpu to run on the CPU")
    deterministic = args.deterministic == "true"
    process_defaults()  # as python -m lit_icl does

    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=["--config", args.config, "--trainer.logger", "false"])
    template = cli.model
    from lit_icl.icssl import ICSSLModule

    if not isinstance(template, ICSSLModule):
        parser.error(f"{args.config} builds a {type(template).__name__}; the bare loop here is IC-SSL's step "
                     "(an ICSSLModule's config); benchmarks/step_speed.py compares any config's")
    dm = cli.datamodule
    dm.hparams.train_batches_per_epoch = max(dm.hparams.train_batches_per_epoch, args.steps + 1)
    device = torch.device(args.accelerator)
    results: dict[str, list[float]] = {"lightning": [], "bare": []}
    for _ in range(args.repeats):
        results["lightning"].append(
            lightning_steps_per_s(copy.deepcopy(template), dm, args.warmup, args.steps, device, deterministic)
        )
        results["bare"].append(bare_steps_per_s(copy.deepcopy(template), dm, args.warmup, args.steps, device, deterministic))
    lit, bare = max(results["lightning"]), max(results["bare"])
    print(
        f"config: {args.config}  device: {args.accelerator}  steps timed: {args.steps - args.warmup}  "
        f"threads: {torch.get_num_threads()}  deterministic: {deterministic}"
    )
    print(f"lightning: {lit:.2f} steps/s  (runs: {', '.join(f'{v:.2f}' for v in results['lightning'])})")
    print(f"bare loop: {bare:.2f} steps/s  (runs: {', '.join(f'{v:.2f}' for v in results['bare'])})")
    print(f"ratio lightning/bare: {lit / bare:.3f}")


if __name__ == "__main__":
    main()

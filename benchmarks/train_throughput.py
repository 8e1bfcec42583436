"""Training steps per second: Lightning path vs a bare PyTorch loop over the same net, data and optimiser.

    python benchmarks/train_throughput.py --config configs/icssl/manifolds.yaml --steps 150 --warmup 20

The config must be an IC-SSL one (the bare loop is ``ICSSLModule``'s step written out; other configs are
refused, and ``benchmarks/step_speed.py`` compares any config's). Both paths build the model and data module from
the same YAML through the project's CLI, start from the same
weights, iterate the same DataLoader, and use the same loss and AdamW settings. Timing starts after
``--warmup`` steps and stops after ``--steps``; each path is measured ``--repeats`` times, interleaved, and the
best run is reported (the least disturbed by other work on the machine). The goal tracked in the issues is
``lightning / bare >= 0.95``.

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

from lit_icl.cli import LitICLCLI, process_defaults


class _StepTimer(Callback):
    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.t0 = self.t1 = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup:
            self.t0 = time.perf_counter()
        if trainer.global_step == self.steps:
            self.t1 = time.perf_counter()


def lightning_steps_per_s(
    module: LightningModule, dm: LightningDataModule, warmup: int, steps: int, device: torch.device,
    deterministic: bool = True,
) -> float:
    timer = _StepTimer(warmup, steps)
    trainer = Trainer(
        deterministic=deterministic,
        max_steps=steps,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    trainer.fit(module, datamodule=dm)
    return (steps - warmup) / (timer.t1 - timer.t0)


def bare_steps_per_s(
    module: LightningModule, dm: LightningDataModule, warmup: int, steps: int, device: torch.device,
    deterministic: bool = True,
) -> float:
    """The same step as ``ICSSLModule.training_step`` + AdamW, without Lightning."""
    torch.use_deterministic_algorithms(deterministic)
    net = module.net.to(device)
    hp = module.hparams
    opt = torch.optim.AdamW(net.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    loader = dm.train_dataloader()
    step, t0 = 0, 0.0
    while step < steps:
        for batch in loader:
            x, y, n_labeled = (batch[k].to(device, non_blocking=True) for k in ("x", "y", "n_labeled"))
            labeled = torch.arange(x.shape[1], device=device).unsqueeze(0) < n_labeled.unsqueeze(1)
            logits = net(x, y, labeled).logits
            loss = module.unlabeled_loss(logits, y, labeled)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step == warmup:
                _sync(device)
                t0 = time.perf_counter()
            if step == steps:
                break
    _sync(device)
    return (steps - warmup) / (time.perf_counter() - t0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

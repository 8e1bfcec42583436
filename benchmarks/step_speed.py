"""Training steps per second of any config: eager vs compiled vs CUDA-graph-captured, Lightning vs a bare loop.

    python benchmarks/step_speed.py --config configs/icssl/manifolds.yaml                     # CPU, eager + default
    python benchmarks/step_speed.py --config configs/coqe/omniglot.yaml --device cuda \\
        --modes off,default,reduce-overhead --steps 300 --warmup 50 --deterministic true,false
    python benchmarks/step_speed.py --config configs/coqe/regression.yaml --config configs/coqe/regression/cpu.yaml

For each compile mode (``off`` is eager; the others are ``--compile.mode`` values) and each deterministic
setting, two paths train the same module, from the same weights, on the same batches:

- ``lightning``: ``Trainer.fit`` with the CLI's :class:`~lit_icl.callbacks.compile.CompileNets` (no logger,
  checkpoints, validation or progress bar: the step alone);
- ``bare``: a plain loop that calls the module's own ``training_step`` (so the same loss and the same values
  computed for logging), ``backward`` and the optimizer from its ``configure_optimizers``, with the same
  compiled nets and CUDA-graph step markers, and nothing else.

Both read the same batches, made ahead and moved to the device before timing (so data loading is not timed;
``benchmarks/main_command.py`` measures a run all-in). Timing starts after ``--warmup`` steps (compilation
and CUDA-graph recording happen there) and each path is timed ``--repeats`` times; the best is reported.
The issue's goal is ``lightning / bare >= 0.95`` for every paper and deterministic mode at most 5 % slower.

``--phases`` records each Lightning run with ``step_trace.PhaseProfiler`` and prints its stages' calls, means and
medians (``phases ...`` lines), the same stages ``main_command.py --phases`` gives for a CLI run: where a run's
training batch costs more than the step alone shows stage by stage.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import os
import sys
import time
import typing
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from bench_options import at_least
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.utilities import move_data_to_device

from lit_icl.callbacks.compile import (
    CUDA_GRAPH_MODES,
    CompileMode,
    CompileNets,
    compile_targets,
    resolve_mode,
)
from lit_icl.cli import process_defaults
from lit_icl.cli.trainer_setup import NoOpProfiler

ROOT = Path(__file__).resolve().parents[1]


def build(configs: list[str], extra: list[str]) -> tuple[LightningModule, LightningDataModule]:
    """The module and data module of a config, as ``python -m lit_icl fit`` builds them."""
    from lit_icl.cli import LitICLCLI

    args = [a for c in configs for a in ("--config", c)] + ["--trainer.logger", "false", *extra]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    return cli.model, cli.datamodule


def batches_ahead(dm: LightningDataModule, n: int, device: torch.device) -> list[Any]:
    """The first ``n`` training batches of the data module, on ``device``, finished by its transfer hooks
    (CoQE gathers its images there, CoQE regression generates its prompts there)."""
    dm.setup("fit")
    out = []
    for batch in itertools.islice(itertools.cycle(dm.train_dataloader()), n):
        batch = move_data_to_device(dm.on_before_batch_transfer(batch, 0), device)
        out.append(dm.on_after_batch_transfer(batch, 0))
    return out


class _Timer(Callback):
    """From the start of batch ``warmup`` to the end of the last batch (fit's own start and end are not timed)."""

    def __init__(self, warmup: int, last: int) -> None:
        self.warmup, self.last, self.t0, self.t1 = warmup, last, 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            _sync(pl_module.device)
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == self.last:
            _sync(pl_module.device)
            self.t1 = time.perf_counter()


def lightning_steps(module: LightningModule, batches: list[Any], mode: str, warmup: int, device: torch.device,
                    deterministic: bool, backend: str = "inductor", profiler: Profiler | None = None) -> float:
    """Steps per second of ``module`` fitted by a Trainer on ``batches`` (on the device already), after ``warmup``.

    ``profiler``: a Lightning profiler for the run (``--phases``: ``step_trace.PhaseProfiler``); by default the
    CLI's ``NoOpProfiler``.
    """
    timer = _Timer(warmup, len(batches) - 1)
    callbacks: list[Callback] = [timer]
    if mode != "off":
        callbacks.append(CompileNets(mode=mode, backend=backend))
    trainer = Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_steps=len(batches), logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0, deterministic=deterministic, callbacks=callbacks,
        # The CLI's default profiler (lit_icl.cli.trainer_setup.no_op_profiler), unless one is given.
        profiler=profiler if profiler is not None else NoOpProfiler(),
    )
    # A list of batches already on the device; Lightning's transfer to the device is then a no-op.
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    return (len(batches) - warmup) / (timer.t1 - timer.t0)


def _stub_trainer(steps: int) -> SimpleNamespace:
    """What a module's ``training_step`` and ``configure_optimizers`` read from ``self.trainer``."""
    return SimpleNamespace(
        global_step=0, global_rank=0, local_rank=0, world_size=1, log_every_n_steps=50, current_epoch=0,
        estimated_stepping_batches=steps, max_steps=steps, training=True, sanity_checking=False, fast_dev_run=False,
        # ICLModule.logging_step asks Lightning's logger connector; the bare loop sets it as Lightning would.
        _logger_connector=SimpleNamespace(should_update_logs=False),
    )


def bare_step(module: LightningModule, stub: Any, opt: torch.optim.Optimizer, sched: Any, batch: Any, i: int) -> None:
    """One training step as Lightning's automatic optimization runs it: ``training_step`` (with the values it computes
    on Lightning's logging steps, ``_LoggerConnector.should_update_logs``), ``zero_grad``, ``backward``, the
    optimizer and the per-step LR schedule. ``stub`` is the module's :func:`_stub_trainer`."""
    stub.global_step = i
    stub._logger_connector.should_update_logs = (i + 1) % stub.log_every_n_steps == 0
    loss = module.training_step(batch, i)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if sched is not None:
        sched.step()


def bare_steps(module: LightningModule, batches: list[Any], mode: str, warmup: int, device: torch.device,
               deterministic: bool, backend: str = "inductor", profiler: Any = None) -> float:
    """The module's own step without Lightning: ``training_step``, ``backward``, the optimizer, the LR schedule.

    ``profiler`` (a ``torch.profiler.profile``, not started) records the timed steps (``profile_step.py``).
    """
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    module = module.to(device).train()
    stub = _stub_trainer(len(batches))
    module._trainer = stub  # type: ignore[assignment]  # attribute reads only
    module.log = lambda *args, **kwargs: None  # type: ignore[method-assign]  # logging is Lightning's part
    opt_conf = module.configure_optimizers()
    opt, sched = _optimizer(opt_conf)
    mode = resolve_mode(mode, device, module)
    if mode != "off":
        for net in compile_targets(module):
            net.compile(backend=backend, mode=mode if backend == "inductor" else None,
                        dynamic=getattr(module, "compile_dynamic", False))
    mark = mode in CUDA_GRAPH_MODES and device.type == "cuda"
    t0 = 0.0
    for i, batch in enumerate(batches):
        if i == warmup:
            _sync(device)
            if profiler is not None:
                profiler.start()
            t0 = time.perf_counter()
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        bare_step(module, stub, opt, sched, batch, i)
    _sync(device)
    elapsed = time.perf_counter() - t0
    if profiler is not None:
        profiler.stop()
    module._trainer = None
    return (len(batches) - warmup) / elapsed


def _optimizer(conf: Any) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer and (step-interval) scheduler of a ``configure_optimizers`` result."""
    if isinstance(conf, torch.optim.Optimizer):
        return conf, None
    if isinstance(conf, dict):
        sched = conf.get("lr_scheduler")
        return conf["optimizer"], sched["scheduler"] if isinstance(sched, dict) else sched
    raise TypeError(f"step_speed.py handles one optimizer (and scheduler), got {type(conf).__name__}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace
            ) -> tuple[torch.device, LightningModule, list[Any], dict[str, Any]]:
    """The device, the module as the CLI builds it, ``args.steps`` batches on the device and the module's
    initial weights (each timed run starts from them), with torch set up as ``lit_icl.cli.main`` sets it."""
    if args.warmup >= args.steps:  # each alone: their types, at_least (roofline.py sets both itself)
        parser.error("--warmup must be smaller than --steps")
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f"--device {args.device}: {err}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; pass --device cpu to run on the CPU")
    os.chdir(ROOT)
    process_defaults()  # as python -m lit_icl does (TF32 on a GPU)
    template, dm = build(args.config, args.set)
    batches = batches_ahead(dm, args.steps, device)
    return device, template, batches, copy.deepcopy(template.state_dict())


def describe(device: torch.device) -> str:
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", default="off,default", help="comma-separated: off and --compile.mode values")
    parser.add_argument("--deterministic", default="true", help="true, false or true,false")
    parser.add_argument("--paths", default="lightning,bare")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: a quick check)")
    parser.add_argument("--steps", type=at_least(1), default=60, help="steps per timed run, warm-up included")
    parser.add_argument("--warmup", type=at_least(0), default=10)
    parser.add_argument("--repeats", type=at_least(1), default=1)
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument, e.g. --set=--data.init_args.batch_size=8")
    parser.add_argument("--phases", action="store_true",
                        help="record the Lightning runs' stages (step_trace.PhaseProfiler) and print each stage's "
                             "calls, mean and median, as main_command.py --phases does for a CLI run")
    parser.add_argument("--top", type=int, default=8, help="stages printed by --phases")
    args = parser.parse_args(argv)
    modes = typing.get_args(CompileMode)
    for option, given, allowed in (("--modes", args.modes, modes), ("--deterministic", args.deterministic,
                                   ("true", "false")), ("--paths", args.paths, ("lightning", "bare"))):
        unknown = [v for v in given.split(",") if v not in allowed]
        if unknown:
            parser.error(f"{option}: unknown {', '.join(repr(v) for v in unknown)}; choose from {', '.join(allowed)}")
    device, template, batches, state = prepare(parser, args)
    print(f"config: {' + '.join(args.config)}  device: {describe(device)}  torch {torch.__version__}"
          f"  threads {torch.get_num_threads()}  steps timed: {args.steps - args.warmup} (after {args.warmup})")
    results: dict[tuple[str, bool, str], float] = {}
    runners = {"lightning": lightning_steps, "bare": bare_steps}
    for det in [d.strip() == "true" for d in args.deterministic.split(",")]:
        for mode in args.modes.split(","):
            for path in args.paths.split(","):
                best = 0.0
                for _ in range(args.repeats):
                    module = copy.deepcopy(template)
                    module.load_state_dict(state)
                    torch._dynamo.reset()  # each compiled run compiles (and records) from scratch
                    extra = {}
                    if args.phases and path == "lightning":
                        # Imported here: only --phases needs the script beside this one.
                        from step_trace import PhaseProfiler
                        extra["profiler"] = profiler = PhaseProfiler()
                    try:
                        best = max(best, runners[path](module, batches, mode, args.warmup, device, det,
                                                       args.backend, **extra))
                    except Exception as err:  # noqa: BLE001  # one failing mode must not hide the others
                        print(f"{path:9s} mode={mode:16s} deterministic={str(det).lower():5s}: FAILED "
                              f"{type(err).__name__}: {str(err).splitlines()[0][:300]}", flush=True)
                        best = float("nan")
                        break
                results[(path, det, mode)] = best
                print(f"{path:9s} mode={mode:16s} deterministic={str(det).lower():5s}: {best:8.2f} steps/s",
                      flush=True)
                if args.phases and path == "lightning" and not math.isnan(best):  # not after a failure
                    from step_trace import phase_lines
                    stages = phase_lines(profiler.summary(), args.top)
                    print(f"phases    mode={mode:16s} deterministic={str(det).lower():5s}: " + "; ".join(stages),
                          flush=True)
    for det in sorted({k[1] for k in results}, reverse=True):
        for mode in args.modes.split(","):
            lit, bare = results.get(("lightning", det, mode)), results.get(("bare", det, mode))
            if lit and bare:
                print(f"ratio lightning/bare mode={mode} deterministic={str(det).lower()}: {lit / bare:.3f}")
    for mode in args.modes.split(","):
        for path in args.paths.split(","):
            on, off = results.get((path, True, mode)), results.get((path, False, mode))
            if on and off:
                print(f"deterministic cost {path} mode={mode}: {100 * (off / on - 1):+.1f} % time")
    eager = {path: results.get((path, True, "off")) or results.get((path, False, "off")) for path in ("lightning", "bare")}
    for (path, det, mode), value in results.items():
        if mode != "off" and eager.get(path):
            print(f"speed-up over eager {path} mode={mode} deterministic={str(det).lower()}: {value / eager[path]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

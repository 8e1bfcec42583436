"""Where a GPU run's host waits for its device: host reads per training step and per validation round of every
paper's main config, counted on the CPU.

    python benchmarks/host_reads.py                                  # every paper's main config
    python benchmarks/host_reads.py --only icssl_manifolds --sites   # and where each read is made
    python benchmarks/host_reads.py --csv experiments/results/host_reads_cpu.csv

A GPU step keeps the device busy only while the host queues kernels ahead of it; each read of a device value on
the host (``item()``, ``bool(t)``, ``tolist()``, boolean-mask indexing, ``nonzero``, ...) stops the host until
the device has caught up. Each study runs the config through the project's CLI (its callbacks, TensorBoard
logger and checkpoints) on the CPU with :class:`lit_icl.callbacks.HostReadCensus`, which takes the project's
CUDA branches (fused Adam, the loss check deferred to logging steps, ``eigh`` on the host) and counts the reads of

- ``step``: training steps that are not logging steps (49 in 50 of a main config's steps; the goal is 0);
- ``update``: the parameter update, part of each step;
- ``logging step``: the steps whose logged values Lightning writes (a log interval of 2 here);
- ``val batch`` and ``val round``: each validation step, and the whole validation loop with its epoch end.

It trains ``--warmup + 2 * --pairs`` steps, then validates on ``--val-batches`` batches per loader. Counts are
exact and repeatable; the configs' sizes do not change them, except where a loop runs per label ratio or metric.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings

from bench_options import at_least
from launches_per_step import Study, selected_studies, study_arguments, study_row, write_rows
from lightning.pytorch import LightningDataModule, LightningModule

from lit_icl.callbacks.host_reads import WINDOWS, HostReadCensus


def measure(study: Study, warmup: int, pairs: int, val_batches: int, extra: list[str], sites: bool) -> HostReadCensus:
    """Train and validate ``study`` on the CPU with a census; the census."""
    from lit_icl.cli import LitICLCLI

    steps = warmup + 2 * pairs
    census = HostReadCensus(warmup=warmup, sites=sites)
    with tempfile.TemporaryDirectory() as tmp:
        args = [a for c in study.configs for a in ("--config", c)]
        args += [
            *study.extra, "--trainer.accelerator", "cpu", "--trainer.max_steps", str(steps),
            "--trainer.max_epochs", "-1", "--trainer.log_every_n_steps", "2",
            "--trainer.val_check_interval", str(steps), "--trainer.check_val_every_n_epoch", "null",
            "--trainer.limit_val_batches", str(val_batches), "--trainer.num_sanity_val_steps", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.logger.init_args.save_dir", tmp, "--trainer.default_root_dir", tmp, *extra,
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
            cli.trainer.callbacks.insert(0, census)
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return census


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=at_least(0), default=2, help="steps trained before counting")
    parser.add_argument("--pairs", type=at_least(1), default=2, help="pairs of steps counted (one logging step each)")
    parser.add_argument("--val-batches", type=at_least(1), default=2, help="validation batches per loader")
    parser.add_argument("--sites", action="store_true", help="print where each read is made")
    study_arguments(parser)
    args = parser.parse_args(argv)
    rows = []
    for study in selected_studies(parser, args):
        print(f"== {study.name}", flush=True)  # the census prints its summary at the end of the fit
        census = measure(study, args.warmup, args.pairs, args.val_batches, args.set, args.sites)
        means = census.means()
        rows.append(study_row(study, args.label, {
            **{f"{w.replace(' ', '_')}_host_reads": f"{means[w][0]:.1f}" for w in WINDOWS},
            **{f"{w.replace(' ', '_')}_kinds": "; ".join(f"{k} {v:g}" for k, v in means[w][1].most_common())
               for w in WINDOWS},
            "val_batches": str(args.val_batches),
        }))
    write_rows(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

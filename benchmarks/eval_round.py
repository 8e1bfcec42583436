"""Seconds per validation round of a config, as its run makes one: the module's steps and the callbacks' metrics.

    python benchmarks/eval_round.py --config configs/icssl/manifolds.yaml
    python benchmarks/eval_round.py --config configs/icssl/manifolds.yaml --rounds 7 --top 12

A run validates every epoch: IC-SSL's manifolds config every 250 training steps, so on a GPU, where those steps
take a second or two, the round is a share of the run's wall time. This builds the config's trainer, module and
data through the CLI (no logger, eager unless ``--set=--compile.mode=...``), runs one round to warm up (IC-SSL
solves its reference eigenmaps there, and reuses them in later rounds as a run does), then times ``--rounds``
rounds of ``trainer.validate`` and prints the best and the median, with the time per batch. ``--top N`` profiles
one more round and lists the N aten ops with the most own CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

from bench_options import at_least
from lightning.pytorch import LightningDataModule, LightningModule
from torch.profiler import profile

from lit_icl.cli import LitICLCLI, process_defaults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--rounds", type=at_least(1), default=5, help="rounds timed after the warm-up round")
    parser.add_argument("--batches", type=at_least(1, note=" (or left out for all)"), default=None,
                        help="validation batches per round (default: all)")
    parser.add_argument("--top", type=int, default=0, help="profile one more round and list its top ops")
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument, e.g. --set=--compile.mode=default")
    args = parser.parse_args(argv)

    process_defaults()  # as python -m lit_icl does
    with tempfile.TemporaryDirectory() as root:
        cli_args = [a for c in args.config for a in ("--config", c)]
        cli_args += ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                     "--trainer.default_root_dir", root, *args.set]
        if args.batches is not None:
            cli_args += ["--trainer.limit_val_batches", str(args.batches)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=cli_args)
        trainer, model, data = cli.trainer, cli.model, cli.datamodule

        def one_round() -> float:
            start = time.perf_counter()
            trainer.validate(model, datamodule=data, verbose=False)
            return time.perf_counter() - start

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            one_round()
            seconds = [one_round() for _ in range(args.rounds)]
            batches = int(sum(trainer.num_val_batches))
            best, median = min(seconds), statistics.median(seconds)
            print(f"{' + '.join(args.config)}: validation round of {batches} batches, {args.rounds} timed: best "
                  f"{best:.3f} s, median {median:.3f} s ({1000 * median / batches:.1f} ms per batch)")
            if args.top:
                with profile() as prof:
                    one_round()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

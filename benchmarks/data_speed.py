"""Milliseconds per training batch that a config's data module makes in the training process (``num_workers=0``).

    python benchmarks/data_speed.py --config configs/coqe/omniglot.yaml
    python benchmarks/data_speed.py --config configs/icssl/manifolds.yaml --batches 500

On a GPU a step under CUDA graphs takes a few milliseconds, so making the next batch in the training process
is a share of it; ``--data.init_args.num_workers N`` moves it to DataLoader workers. This builds the config's
data module through the CLI and times its training loader (the first batch, which builds what the module
builds on first use, is not timed), and apart from that the data module's ``on_after_batch_transfer``, which
finishes a batch on the training device (CoQE gathers its images there, CoQE regression draws its prompts, the
multi-modal synthetic runs gather their fixed training set): host work here, device work on a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings

from lightning.pytorch import LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI


def ms_per_batch(configs: list[str], batches: int) -> tuple[float, float]:
    """``(loader ms, on_after_batch_transfer ms)`` per training batch, on the CPU."""
    args = [a for c in configs for a in ("--config", c)] + ["--trainer.logger", "false"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    dm = cli.datamodule
    dm.setup("fit")
    loader = dm.train_dataloader()
    it = iter(loader)
    dm.on_after_batch_transfer(next(it), 0)
    # Two passes over the same batches, each timing one part alone: the loader's timing would otherwise include
    # what the finishing step leaves in the caches (0.46 ms a CoQE batch alone, 2.7 ms interleaved, on our CPU).
    made = 0
    start = time.perf_counter()
    for _ in itertools.islice(it, batches):
        made += 1
    loading = time.perf_counter() - start
    finishing = 0.0
    for batch in itertools.islice(iter(loader), 1, batches + 1):
        start = time.perf_counter()
        dm.on_after_batch_transfer(batch, 0)
        finishing += time.perf_counter() - start
    return 1000 * loading / made, 1000 * finishing / made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--batches", type=int, default=200, help="batches timed (at most one epoch's)")
    args = parser.parse_args(argv)
    loading, finishing = ms_per_batch(args.config, args.batches)
    print(f"{' + '.join(args.config)}: {loading:.2f} ms per training batch made in the training process, "
          f"{finishing:.2f} ms more to finish it (on_after_batch_transfer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

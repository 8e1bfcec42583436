"""Milliseconds per training batch that a config's data module makes in the training process (``num_workers=0``).

    python benchmarks/data_speed.py --config configs/coqe/omniglot.yaml
    python benchmarks/data_speed.py --config configs/icssl/manifolds.yaml --batches 500

On a GPU a step under CUDA graphs takes a few milliseconds, so making the next batch in the training process
is a share of it; ``--data.init_args.num_workers N`` moves it to DataLoader workers. This builds the config's
data module through the CLI and times its training loader alone (the first batch, which builds what the
module builds on first use, is not timed).
"""

from __future__ import annotations

import argparse
import time
import warnings

from lightning.pytorch import LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI


def ms_per_batch(configs: list[str], batches: int) -> float:
    args = [a for c in configs for a in ("--config", c)] + ["--trainer.logger", "false"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)
    dm = cli.datamodule
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    next(it)
    start = time.perf_counter()
    made = 0
    for _ in it:
        made += 1
        if made == batches:
            break
    return 1000 * (time.perf_counter() - start) / made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--batches", type=int, default=200, help="batches timed (at most one epoch's)")
    args = parser.parse_args(argv)
    ms = ms_per_batch(args.config, args.batches)
    print(f"{' + '.join(args.config)}: {ms:.2f} ms per training batch made in the training process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Milliseconds per training batch that a config's data module makes in the training process (``num_workers=0``).

    python benchmarks/data_speed.py --config configs/coqe/omniglot.yaml
    python benchmarks/data_speed.py --config configs/icssl/manifolds.yaml --batches 500

On a GPU a step under CUDA graphs takes a few milliseconds, so making the next batch in the training process
is a share of it; ``--data.init_args.num_workers N`` moves it to DataLoader workers. This builds the config's
data module through the CLI and times its training loader (the first batch, which builds what the module
builds on first use, is not timed), and apart from that the data module's ``on_after_batch_transfer``, which
finishes a batch on the training device (CoQE gathers its images there, CoQE regression draws its prompts, the
multi-modal synthetic runs gather their fixed training set): host work here, device work on a GPU.

``--workers N`` asks instead what a batch costs the training process when ``N`` DataLoader workers make it: the
time spent in ``next()`` per batch while the workers keep ahead, with a training step of ``--step-ms``
milliseconds simulated by sleeping between batches (so the workers have a core to run on even on a small
machine). That time is receiving the batch: torch passes each tensor through shared memory, by default
(``--sharing file_descriptor``) one socket round trip to the worker per tensor, or (``file_system``) by the shared
memory's file name. Pinned memory, which the loaders add on a GPU, moves the receiving to a thread of its own and
is not measured here.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from bench_options import at_least
from step_speed import build

from lit_icl.cli import process_defaults


def ms_per_batch(configs: list[str], batches: int) -> tuple[float, float]:
    """``(loader ms, on_after_batch_transfer ms)`` per training batch, on the CPU."""
    _, dm = build(configs, [])
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


def ms_in_next(configs: list[str], batches: int, workers: int, step_ms: float) -> tuple[float, float]:
    """``(mean, median)`` milliseconds the training process spends in ``next()`` per training batch, with
    ``workers`` workers and a step of ``step_ms`` between batches (the first ten batches are not timed)."""
    _, dm = build(configs, ["--data.init_args.num_workers", str(workers)])
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    for _ in range(10):  # the workers start and fill their queue
        next(it)
    waits = []
    for _ in range(batches):
        time.sleep(step_ms / 1000)
        start = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - start)
    return 1000 * statistics.mean(waits), 1000 * statistics.median(waits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--batches", type=at_least(1), default=200,
                        help="batches timed (at most one epoch's)")
    parser.add_argument("--workers", type=at_least(0), default=None,
                        help="time what a batch costs the training process with this many workers (0: none)")
    parser.add_argument("--step-ms", type=float, default=5.0, help="with --workers: the simulated step")
    parser.add_argument("--sharing", choices=torch.multiprocessing.get_all_sharing_strategies(),
                        default=torch.multiprocessing.get_sharing_strategy(),
                        help="with --workers: how tensors travel from the workers (torch's default first)")
    args = parser.parse_args(argv)
    process_defaults()  # as python -m lit_icl does
    if args.workers is not None:
        torch.multiprocessing.set_sharing_strategy(args.sharing)
        mean, median = ms_in_next(args.config, args.batches, args.workers, args.step_ms)
        print(f"{' + '.join(args.config)}: {mean:.3f} ms (median {median:.3f}) per training batch in the training "
              f"process with {args.workers} workers ({args.sharing}), a {args.step_ms:g} ms step between batches")
        return 0
    loading, finishing = ms_per_batch(args.config, args.batches)
    print(f"{' + '.join(args.config)}: {loading:.2f} ms per training batch made in the training process, "
          f"{finishing:.2f} ms more to finish it (on_after_batch_transfer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

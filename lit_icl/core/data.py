"""Data plumbing shared by papers whose episodes are generated on the fly.

The pattern (see ``lit_icl.icssl.data`` for a complete example): a map-style dataset whose item ``i`` is a
*chunk* of episodes generated in one vectorised call from a generator seeded by ``(data_seed, split, i)``;
training uses :class:`EpochSampler` so item indices encode the epoch; the DataLoader stacks
``batch_size / chunk_size`` chunks with :func:`collate_chunks`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from lit_icl.core.errors import ConfigError


def collate_chunks(items: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Concatenate chunks along the episode axis: ``batch_size / chunk_size`` items -> one batch."""
    return {k: torch.cat([it[k] for it in items]) for k in items[0]}


class EpochSampler(DistributedSampler):
    """Global item indices of the current epoch, ``epoch * length + i``, sharded across DDP ranks.

    Lightning calls ``set_epoch`` before every training epoch, which makes training data fresh each epoch
    while keeping it a pure function of the index. Rank ``r`` of ``k`` takes items ``r, r + k, ...`` in order.
    Being a ``DistributedSampler`` it is used as is under DDP (Lightning would otherwise wrap it in a
    *shuffling* distributed sampler), so ``k`` ranks with ``b`` episodes per step see exactly the episodes
    one process sees with ``k * b``.
    """

    def __init__(self, length: int, num_replicas: int = 1, rank: int = 0):
        if length % num_replicas:
            raise ConfigError(f"{length} items per epoch cannot be split evenly over {num_replicas} ranks")
        super().__init__(range(length), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.length = length

    def __iter__(self) -> Iterator[int]:
        start = self.epoch * self.length
        return iter(range(start + self.rank, start + self.length, self.num_replicas))

    def __len__(self) -> int:
        return self.length // self.num_replicas


def chunk_loader(
    dataset: Dataset,
    batch_size: int,
    chunk_size: int,
    num_workers: int = 0,
    sampler: Sampler[int] | None = None,
) -> DataLoader:
    """A DataLoader that stacks ``batch_size / chunk_size`` chunks of episodes into one batch, in index order.

    Workers are re-forked every epoch (not persistent) so they see the :class:`EpochSampler`'s new epoch, and run
    one intra-op thread each so they do not oversubscribe the cores. Items draw only from their own seeded
    generators, so no per-worker RNG seeding is needed.
    """
    if batch_size % chunk_size:
        raise ConfigError(f"batch_size={batch_size} must be a multiple of chunk_size={chunk_size}")
    return DataLoader(
        dataset,
        batch_size=batch_size // chunk_size,
        sampler=sampler,
        shuffle=False,
        collate_fn=collate_chunks,
        num_workers=num_workers,
        persistent_workers=False,
        worker_init_fn=_single_thread_worker if num_workers > 0 else None,
    )


def _single_thread_worker(worker_id: int) -> None:
    torch.set_num_threads(1)

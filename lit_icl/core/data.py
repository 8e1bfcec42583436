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

"""Seeds for generated data: every sample is a pure function of ``(data_seed, split, ..., index)``.

A dataset never touches the global RNG. Each item builds its own ``torch.Generator`` from a hash of its
coordinates, so what it returns does not depend on workers, DDP ranks, batch order or resume point.
Data computed once and then trained on (a stand-in's PCA) is computed on one thread (:func:`one_thread`), so it
does not depend on how many threads the building process had either.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any tuple of printable parts (stable across processes and Python versions).

    ``hash()`` is salted per process for strings, so it would give different data on different DDP ranks;
    BLAKE2 of the parts' text does not.
    """
    text = "/".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def make_generator(*parts: object) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by :func:`derive_seed` of ``parts``."""
    return torch.Generator().manual_seed(derive_seed(*parts))


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread, then restore the thread count.

    BLAS and LAPACK split a product or an SVD into blocks by thread count, so the last bits of a float result
    change with it: an SVD of avmnist_lite's 4,000 x 784 images differed in 4 % of its float32 entries between a
    1- and a 2-thread process, and training diverged from there. Built data must not depend on that.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

"""Seeds for generated data: every sample is a pure function of ``(data_seed, split, ..., index)``.

A dataset never touches the global RNG. Each item builds its own ``torch.Generator`` from a hash of its
coordinates, so what it returns does not depend on workers, DDP ranks, batch order or resume point.
"""

from __future__ import annotations

import hashlib

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

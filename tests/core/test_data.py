"""core.data: the seeded-chunk dataset base every paper specialises."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_icl.core.data import SeededChunks
from lit_icl.core.seeding import derive_seed, make_generator


class _Normal(SeededChunks):
    """Chunks of 3 standard normal draws; a fixed training set walks ``i mod 4`` when ``cycle`` is set."""

    def __init__(self, length: int, data_seed: int, stream: tuple, cycle: int | None = None):
        super().__init__(length, data_seed, stream)
        self.cycle = cycle

    def keys(self, index: int) -> tuple[object, ...]:
        return super().keys(index % self.cycle if self.cycle else index)

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        return {"x": torch.randn(3, generator=self.generator(index)), "seed": torch.tensor([self.seed(index)])}


def test_items_are_a_pure_function_of_seed_stream_and_index() -> None:
    a, b = _Normal(8, 5, ("train",)), _Normal(8, 5, ("train",))
    assert len(a) == 8
    assert torch.equal(a[3]["x"], b[3]["x"])  # another instance, same item
    assert torch.equal(a[3]["x"], a[3]["x"])  # asked twice, same item (no shared RNG state)
    assert torch.equal(a[3]["x"], torch.randn(3, generator=make_generator(5, "train", 3)))  # the documented seed
    assert int(a[3]["seed"]) == derive_seed(5, "train", 3)
    assert not torch.equal(a[3]["x"], a[4]["x"])
    assert not torch.equal(a[3]["x"], _Normal(8, 5, ("val",))[3]["x"])  # streams differ
    assert not torch.equal(a[3]["x"], _Normal(8, 6, ("train",))[3]["x"])  # data seeds differ


def test_keys_map_indices() -> None:
    cyc = _Normal(100, 0, ("train",), cycle=4)
    assert torch.equal(cyc[1]["x"], cyc[5]["x"]) and torch.equal(cyc[1]["x"], cyc[97]["x"])
    assert not torch.equal(cyc[1]["x"], cyc[2]["x"])

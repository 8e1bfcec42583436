"""Data sizes beyond the machine's memory (:mod:`lit_icl.core.memory`): the refusal line and the memory read."""

from __future__ import annotations

import pytest

from lit_icl.core import memory
from lit_icl.core.errors import ConfigError
from lit_icl.core.memory import DataPiece, check_data_fits, machine_memory

PIECES = [DataPiece("one training batch", 3 * 2**30, "batch_size=3 prompts of 1 GiB"),
          DataPiece("the fixed training set", 5 * 2**30, "train_prompts=5 prompts of 1 GiB")]


def test_the_largest_piece_beyond_the_limit_is_named_with_its_gib_and_sizes() -> None:
    with pytest.raises(ConfigError) as info:
        check_data_fits(PIECES, limit=4 * 2**30)
    assert str(info.value) == ("a size in the config is far too large for this machine: the fixed training set would "
                               "need 5.0 GiB (train_prompts=5 prompts of 1 GiB), and it has 4.0 GiB of memory; lower "
                               "those sizes")


def test_pieces_within_the_limit_and_an_unknown_limit_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    check_data_fits(PIECES, limit=5 * 2**30)  # equal to the limit: fits
    check_data_fits([], limit=1)
    monkeypatch.setattr(memory, "machine_memory", lambda: None)  # a system that does not say: nothing refused
    check_data_fits([DataPiece("one batch", 2**80, "huge")])


def test_the_machine_memory_is_read_and_no_more_than_the_physical_memory() -> None:
    import os

    memory = machine_memory()
    assert memory is not None and 0 < memory <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

"""Shared core helpers: seeds, plots."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from lit_icl.core.plotting import _nice_ticks, line_plot_png
from lit_icl.core.seeding import derive_seed, make_generator


def test_derived_seeds_are_stable_and_distinct() -> None:
    # A fixed value: seeds must not depend on the process (Python's str hash is salted per process).
    assert derive_seed(0, "train", 3) == derive_seed(0, "train", 3)
    assert len({derive_seed(0, s, i) for s in ("train", "val", "test") for i in range(100)}) == 300
    assert 0 <= derive_seed("x") < 2**63
    g1, g2 = make_generator(1, "val", 0), make_generator(1, "val", 0)
    assert g1.initial_seed() == g2.initial_seed()


@pytest.mark.parametrize(("lo", "hi"), [(3, 39), (0.72, 0.93), (-1.0, 1.0), (5.0, 5.0)])
def test_ticks_cover_the_data_range(lo: float, hi: float) -> None:
    ticks = _nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and len(ticks) >= 2
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1


def test_line_plot_is_a_png_of_the_requested_size() -> None:
    png = line_plot_png([3, 5, 10], {"model": [0.7, 0.8, float("nan")], "baseline": [0.6, 0.6, 0.6]},
                        title="t", xlabel="x", ylabel="y", size=(400, 300))
    img = Image.open(io.BytesIO(png.getvalue()))
    assert img.format == "PNG" and img.size == (400, 300)
    with pytest.raises(ValueError, match="series 'bad'"):
        line_plot_png([1, 2], {"bad": [1.0]})

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


def test_report_combines_runs(tmp_path, capsys) -> None:
    import json

    from lit_icl.report import main as report

    for name, accs in (("a", [0.7, 0.9]), ("b", [0.6, 0.8])):
        run = tmp_path / name
        run.mkdir()
        rows = [{"label_ratio": r, "accuracy": a} for r, a in zip([0.03, 0.25], accs)]
        (run / "results.json").write_text(json.dumps({"representation": name.upper(), "results": rows}))
    out = tmp_path / "cmp.png"
    report([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)])
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| run | 0.03 | 0.25 |"
    assert table[2:] == ["| A | 0.700 | 0.900 |", "| B | 0.600 | 0.800 |"]
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        report([str(tmp_path / "missing")])

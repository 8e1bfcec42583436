"""Aggregation (mean and sample sd) and the figures drawn from result rows."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from lit_icl.core.figures import (
    PNG_DPI,
    aggregate,
    bar_figure,
    line_figure,
    mean_sd,
    render,
    save_png,
    select,
)
from lit_icl.core.results import ResultsWriter, result_row


def test_aggregation_is_mean_and_sample_sd() -> None:
    values = [0.7, 0.8, 0.95]
    mean, sd, n = mean_sd(values)
    assert math.isclose(mean, statistics.mean(values)) and math.isclose(sd, statistics.stdev(values)) and n == 3
    assert mean_sd([0.4]) == (0.4, 0.0, 1)
    rows = [{"method": m, "x": x, "value": v} for m, x, v in [("a", 1, 1.0), ("a", 1, 3.0), ("b", 1, 5.0)]]
    stats = aggregate(rows, ["method", "x"])
    assert stats[("a", 1)] == (2.0, math.sqrt(2.0), 2) and stats[("b", 1)] == (5.0, 0.0, 1)
    assert select(rows, method=("a",), x=1) == rows[:2]


def test_figures_draw_one_line_per_method_with_sd_bands() -> None:
    rows = [result_row("acc", v, method=m, r=r) for m, r, v in
            [("a", 0.1, 0.5), ("a", 0.1, 0.7), ("a", 0.2, 0.8), ("b", 0.1, 0.4), ("b", 0.2, 0.6)]]
    fig = line_figure(rows, "r", metric="acc")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"a", "b"}
    assert list(lines["a"].get_ydata()) == pytest.approx([0.6, 0.8])
    assert len(ax.collections) == 1  # only "a" has two runs at a point, so only it gets a band
    bars = bar_figure(rows, "r", metric="acc")
    assert isinstance(bars, Figure) and len(bars.axes[0].patches) == 4
    with pytest.raises(ValueError, match="no rows"):
        line_figure(rows, "r", metric="mse")


def test_a_figure_is_drawn_once_and_its_png_and_tensorboard_image_hold_those_pixels(tmp_path, monkeypatch) -> None:
    rows = [result_row("acc", v, method=m, r=r) for m, r, v in [("a", 0.1, 0.5), ("a", 0.2, 0.8), ("b", 0.1, 0.4)]]
    draws = []
    original = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: (draws.append(fig), original(fig, renderer))[1])
    fig = line_figure(rows, "r", metric="acc")
    pixels = save_png(fig, tmp_path / "acc.png")
    assert len(draws) == 1
    png = Image.open(tmp_path / "acc.png")
    # 6 x 4 inches at the PNG resolution, the whole canvas (the constrained layout keeps the labels inside it)
    assert png.size == (6 * PNG_DPI, 4 * PNG_DPI) and pixels.shape == (4 * PNG_DPI, 6 * PNG_DPI, 4)
    assert np.array_equal(np.asarray(png), pixels)
    assert np.array_equal(render(line_figure(rows, "r", metric="acc")), pixels)  # drawing is deterministic

    # Through the results writer: one drawing serves the PNG and the TensorBoard image.
    logged = []

    class Experiment:
        def add_image(self, tag, image, step, dataformats):
            logged.append((tag, np.asarray(image), step, dataformats))

        def flush(self) -> None:
            pass

    class Logger:
        experiment = Experiment()

    class Module:
        global_step = 7
        test_rows = rows

        def test_figures(self, found):
            return {"acc": line_figure(found, "r", metric="acc")}

    class Trainer:
        callbacks, loggers, log_dir, is_global_zero, fast_dev_run = [], [Logger()], str(tmp_path / "run"), True, False
        datamodule, ckpt_path = None, None

    monkeypatch.setattr("lit_icl.core.results.TensorBoardLogger", Logger)
    monkeypatch.setattr("lit_icl.core.results.run_meta", lambda trainer, module, log_dir: {"seed": 0})
    draws.clear()
    ResultsWriter().on_test_end(Trainer(), Module())
    assert len(draws) == 1
    [(tag, image, step, layout)] = logged
    # At the step where the fit wrote its round of these weights: Lightning writes a round after step N at N - 1.
    assert (tag, step, layout) == ("test/acc", 6, "HWC")
    assert np.array_equal(image, np.asarray(Image.open(tmp_path / "run" / "acc.png"))[..., :3])


def test_more_series_than_colours_are_still_told_apart() -> None:
    """Past 8 series the palette starts again: the ninth line was drawn in the first one's colour and marker."""
    rows = [result_row("acc", 0.1 * s + 0.01 * r, method=f"m{s}", r=r) for s in range(10) for r in (1, 2)]
    lines = line_figure(rows, "r", metric="acc").axes[0].get_lines()
    styles = {(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in lines}
    assert len(lines) == 10 and len(styles) == 10
    bars = [c for c in bar_figure(rows, "r", metric="acc").axes[0].containers if hasattr(c, "patches")]
    assert len(bars) == 10 and len({(c.patches[0].get_facecolor(), c.patches[0].get_hatch()) for c in bars}) == 10

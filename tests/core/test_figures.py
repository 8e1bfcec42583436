"""Aggregation (mean and sample sd) and the figures drawn from result rows."""

from __future__ import annotations

import math
import statistics

import pytest
from matplotlib.figure import Figure

from lit_icl.core.figures import aggregate, bar_figure, line_figure, mean_sd, select
from lit_icl.core.results import result_row


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

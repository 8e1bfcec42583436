"""Figures from tidy result rows, with matplotlib's Agg renderer.

Figures are built as ``matplotlib.figure.Figure`` objects without pyplot, so drawing one never opens a window,
needs no display and does not change the backend of a user's notebook. :func:`render` draws one through Agg once,
and :func:`save_png` writes that drawing, so a figure saved and also logged to TensorBoard is drawn once, not three
times (``savefig(bbox_inches="tight")`` draws twice, ``add_figure`` once more).
Every function takes the rows of :mod:`lit_icl.core.results` and draws the mean over rows that share a point,
with a ±1 sd band (or error bar) when several runs (seeds) contribute to it, so the same code draws one run in
``test`` and many in ``python -m lit_icl.report``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

#: Colour-blind-safe palette (Okabe & Ito).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
#: What tells series apart once the palette's colours have all been used: the i-th series takes the colour
#: ``i % 8`` and the ``i // 8``-th of these (a ninth line in the first colour would be indistinguishable).
LINE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."))
HATCHES = ("", "//", "..", "xx")


def series_style(i: int) -> tuple[str, str, str, str]:
    """``(colour, marker, line style, bar hatch)`` of the ``i``-th series of a figure: distinct for 32 series."""
    colour = PALETTE[i % len(PALETTE)]
    round_ = i // len(PALETTE)
    marker, line = LINE_STYLES[round_ % len(LINE_STYLES)]
    return colour, marker, line, HATCHES[round_ % len(HATCHES)]

Row = Mapping[str, Any]


def select(rows: Iterable[Row], **where: Any) -> list[Row]:
    """Rows whose keys equal every ``where`` value (a tuple or list value means "any of these")."""
    out = []
    for row in rows:
        ok = True
        for key, want in where.items():
            have = row.get(key)
            if isinstance(want, (tuple, list, set, frozenset)):
                ok = have in want
            else:
                ok = have == want
            if not ok:
                break
        if ok:
            out.append(row)
    return out


def mean_sd(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (0 for one value) and count; NaN values are skipped."""
    finite = [float(v) for v in values if not math.isnan(float(v))]
    n = len(finite)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = sum(finite) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else 0.0
    return mean, sd, n


def mean_sd_text(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± sd`` of ``values`` as a table cell: the mean alone for one value, which has no spread to show
    (``± 0.000`` would claim the runs agreed), ``-`` for none."""
    mean, sd, n = mean_sd(values)
    if n == 0:
        return "-"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def aggregate(rows: Iterable[Row], keys: Sequence[str]) -> dict[tuple, tuple[float, float, int]]:
    """``{tuple(row[k] for k in keys): (mean, sd, n)}`` of the ``value`` of the rows sharing those keys."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        groups[tuple(row.get(k) for k in keys)].append(row["value"])
    return {k: mean_sd(v) for k, v in groups.items()}


def sort_key(value: Any) -> tuple:
    # Numbers before strings, each in natural order; None last.
    if isinstance(value, bool) or value is None:
        return (2, str(value))
    if isinstance(value, (int, float)):
        return (0, float(value))
    return (1, str(value))


#: Resolution of the PNGs the project writes (and of the images it logs to TensorBoard).
PNG_DPI = 120


def render(fig: Figure, dpi: float = PNG_DPI) -> np.ndarray:
    """Draw ``fig`` once with Agg at ``dpi``: its pixels as ``(H, W, 4)`` uint8 RGBA.

    The figures here use the constrained layout, which keeps every label inside the canvas, so the whole canvas is
    the picture (no ``bbox_inches="tight"`` pass, which would draw it a second time).
    """
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def save_png(fig: Figure | np.ndarray, path: str | Path, dpi: float = PNG_DPI) -> np.ndarray:
    """Write ``fig`` (a figure, or pixels from :func:`render`) as a PNG at ``path``; return its RGBA pixels."""
    pixels = render(fig, dpi) if isinstance(fig, Figure) else fig
    Image.fromarray(pixels, "RGBA").save(path, format="PNG", dpi=(dpi, dpi))
    return pixels


def new_figure(width: float = 6.0, height: float = 4.0) -> tuple[Figure, Any]:
    """A figure with one axes, grid on."""
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def line_figure(
    rows: Iterable[Row],
    x: str,
    *,
    series: str = "method",
    title: str = "",
    xlabel: str | None = None,
    ylabel: str | None = None,
    xscale: str = "linear",
    x_transform: Callable[[float], float] | None = None,
    ax: Any = None,
    **where: Any,
) -> Figure:
    """One line per ``series`` value of the rows matching ``where``, ``value`` against coordinate ``x``.

    Example: ``line_figure(rows, "label_ratio", metric="accuracy", split="test")``.
    """
    chosen = [r for r in select(rows, **where) if x in r]
    if not chosen:
        raise ValueError(f"no rows with coordinate {x!r} match {where}")
    if ax is None:
        fig, ax = new_figure()
    else:
        fig = ax.figure
    stats = aggregate(chosen, [series, x])
    names = sorted({k[0] for k in stats}, key=sort_key)
    for i, name in enumerate(names):
        pts = sorted(((k[1], v) for k, v in stats.items() if k[0] == name), key=lambda p: sort_key(p[0]))
        xs = [x_transform(p[0]) if x_transform else p[0] for p in pts]
        means = [p[1][0] for p in pts]
        sds = [p[1][1] for p in pts]
        colour, marker, line, _ = series_style(i)
        ax.plot(xs, means, marker=marker, linestyle=line, color=colour, label=str(name))
        if any(p[1][2] > 1 for p in pts):
            ax.fill_between(xs, [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)],
                            color=colour, alpha=0.2, linewidth=0)
    ax.set_xscale(xscale)
    ax.set_xlabel(xlabel if xlabel is not None else x)
    ax.set_ylabel(ylabel if ylabel is not None else str(where.get("metric", "value")))
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small")
    return fig


def bar_figure(
    rows: Iterable[Row],
    category: str,
    *,
    series: str = "method",
    title: str = "",
    ylabel: str | None = None,
    ax: Any = None,
    **where: Any,
) -> Figure:
    """Grouped bars: one group per ``category`` value, one bar per ``series`` value, ±1 sd error bars (on ``ax``, a
    panel of a larger figure, when given)."""
    chosen = [r for r in select(rows, **where) if category in r]
    if not chosen:
        raise ValueError(f"no rows with coordinate {category!r} match {where}")
    stats = aggregate(chosen, [series, category])
    names = sorted({k[0] for k in stats}, key=sort_key)
    cats = sorted({k[1] for k in stats}, key=sort_key)
    if ax is None:
        fig, ax = new_figure()
    else:
        fig = ax.figure
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(cats))]
        vals = [stats.get((name, c), (float("nan"), 0.0, 0)) for c in cats]
        colour, _, _, hatch = series_style(i)
        ax.bar(xs, [v[0] for v in vals], width, yerr=[v[1] for v in vals], label=str(name), color=colour,
               hatch=hatch or None, capsize=3)
    ax.set_xticks(range(len(cats)), [str(c) for c in cats])
    ax.set_xlabel(category)
    ax.set_ylabel(ylabel if ylabel is not None else str(where.get("metric", "value")))
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small")
    return fig

"""Small, dependency-free figures for run folders and TensorBoard.

Figures are drawn with Pillow, which torchvision already depends on, so the project needs no plotting
library. They are meant to be read at a glance next to a run's ``results.csv``; for publication figures load
the CSV into the plotting tool of your choice.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from PIL import Image, ImageDraw, ImageFont

# Colour-blind-safe palette (Okabe & Ito).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (1-2-5 steps)."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step
    stop = math.ceil(hi / step - 1e-9) * step
    return [round(start + i * step, 10) for i in range(int(round((stop - start) / step)) + 1)]


def line_plot_png(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    size: tuple[int, int] = (720, 480),
) -> io.BytesIO:
    """A line chart with markers, axes, ticks and a legend, as PNG bytes.

    Args:
        x: shared x values.
        series: legend label -> y values (same length as ``x``); NaN values are skipped.
        title, xlabel, ylabel: text.
        size: image size in pixels.
    """
    if not series:
        raise ValueError("line_plot_png needs at least one series")
    for name, ys in series.items():
        if len(ys) != len(x):
            raise ValueError(f"series {name!r} has {len(ys)} values but there are {len(x)} x values")
    width, height = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    left, right, top, bottom = 80, 20, 40, 60

    finite = [v for ys in series.values() for v in ys if v == v and math.isfinite(v)]
    y_lo, y_hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = 0.05 * (y_hi - y_lo or 1.0)
    y_ticks = _nice_ticks(y_lo - pad, y_hi + pad)
    x_ticks = _nice_ticks(min(x), max(x))
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]

    def px(xv: float, yv: float) -> tuple[float, float]:
        u = left + (xv - x0) / (x1 - x0 or 1.0) * (width - left - right)
        v = height - bottom - (yv - y0) / (y1 - y0 or 1.0) * (height - top - bottom)
        return u, v

    # Grid, ticks and axes.
    for t in y_ticks:
        _, v = px(x0, t)
        draw.line([(left, v), (width - right, v)], fill="#e5e5e5")
        draw.text((left - 8, v), f"{t:g}", fill="black", font=font, anchor="rm")
    for t in x_ticks:
        u, _ = px(t, y0)
        draw.line([(u, top), (u, height - bottom)], fill="#e5e5e5")
        draw.text((u, height - bottom + 6), f"{t:g}", fill="black", font=font, anchor="mt")
    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    draw.text((width / 2, 12), title, fill="black", font=font, anchor="mt")
    draw.text(((left + width - right) / 2, height - 22), xlabel, fill="black", font=font, anchor="mt")
    label_img = Image.new("RGB", (height, 20), "white")
    ImageDraw.Draw(label_img).text((height / 2, 10), ylabel, fill="black", font=font, anchor="mm")
    img.paste(label_img.rotate(90, expand=True), (8, 0))

    # Series and legend.
    for k, (name, ys) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        pts = [px(xv, yv) for xv, yv in zip(x, ys) if yv == yv and math.isfinite(yv)]
        if len(pts) > 1:
            draw.line(pts, fill=colour, width=2)
        for u, v in pts:
            draw.ellipse([u - 3, v - 3, u + 3, v + 3], fill=colour)
        ly = top + 10 + 16 * k
        draw.line([(left + 12, ly), (left + 32, ly)], fill=colour, width=2)
        draw.text((left + 38, ly), name, fill="black", font=font, anchor="lm")

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    buf.seek(0)
    return buf

"""Matplotlib figures of the paper's synthetic experiments (Figs. 2, 3, 5, 6), drawn from tidy result rows.

Kept apart from the module so that a report over several runs can call :func:`mmca_figures` on their pooled
rows. Figures are ``matplotlib.figure.Figure`` objects built without pyplot (``lit_icl.core.figures.new_figure``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from matplotlib.figure import Figure

from lit_icl.core.figures import new_figure


def _series(
    rows: list[dict[str, Any]], metric: str, x: str, by: tuple[str, ...]
) -> dict[tuple, dict[float, list[float]]]:
    """``{series key: {x: [values]}}`` for rows of ``metric`` that have coordinate ``x`` (values pooled over runs)."""
    out: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("metric") == metric and r.get(x) is not None:
            out[tuple(r.get(k) for k in by)][r[x]].append(float(r["value"]))
    return out


def _line(ax: Any, points: dict[float, list[float]], label: str, **kw: Any) -> None:
    xs = sorted(points)
    mean = [sum(points[v]) / len(points[v]) for v in xs]
    if any(len(points[v]) > 1 for v in xs):
        sd = [
            (sum((p - m) ** 2 for p in points[v]) / max(len(points[v]) - 1, 1)) ** 0.5
            for v, m in zip(xs, mean)
        ]
        ax.errorbar(xs, mean, yerr=sd, marker="o", capsize=3, label=label, **kw)
    else:
        ax.plot(xs, mean, marker="o", label=label, **kw)


def _finish(
    fig: Figure,
    ax: Any,
    title: str,
    xlabel: str,
    ylabel: str,
    logy: bool = True,
    logx: bool = False,
    clip_top: float | None = None,
) -> Figure:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    bottom, top = ax.get_ylim()
    if clip_top is not None and top > clip_top:
        ax.set_ylim(bottom, clip_top)
        ax.set_ylabel(f"{ylabel} (clipped at {clip_top:g})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def mmca_figures(rows: list[dict[str, Any]]) -> dict[str, Figure]:
    """The figures the rows support, by name:

    - ``icl_error_vs_context_length``: Fig. 2 left / Figs. 5-6, one line per method at its largest depth;
    - ``mse_vs_context_length``: the same with the Bayes predictor's MSE as the floor;
    - ``icl_error_vs_depth``: Fig. 2 right at the largest ``L_te``, when some method has several depths;
    - ``layer_scalars``: Fig. 3 left, ``alpha_hat_t``, ``beta_hat_t`` against ``+-alpha*``;
    - ``whitening_residual``: Fig. 3 right, ``||X F_t^T / L - I||_F / sqrt(d)`` per layer.
    """
    figs: dict[str, Figure] = {}
    for metric, name, ylabel in (
        ("icl_error", "icl_error_vs_context_length", "E (y_hat - <w, x_q>)^2"),
        ("mse", "mse_vs_context_length", "E (y_hat - y_q)^2"),
    ):
        series = _series(rows, metric, "context_length", ("method", "depth"))
        if not series:
            continue
        # Fixed depth (Fig. 2 left): the depth the net was trained at (that of its alpha_hat rows), else the largest.
        trained = {r["method"]: r.get("depth") for r in rows if r.get("metric") == "alpha_hat"}
        top_depth: dict[str, Any] = {}
        for method, depth in series:
            if depth is not None and (top_depth.get(method) is None or depth > top_depth[method]):
                top_depth[method] = depth
        top_depth.update({m: t for m, t in trained.items() if (m, t) in series})
        fig, ax = new_figure(6.4, 4.4)
        for (method, depth), pts in sorted(series.items(), key=lambda kv: str(kv[0])):
            if depth != top_depth.get(method):
                continue
            if metric == "icl_error" and method == "bayes":
                continue  # identically 0: the reference the ICL error measures against
            _line(ax, pts, method if depth is None else f"{method} (T={depth})")
        # Deep tied stacks explode at tiny L_te (Lambda_hat is far from Lambda); keep the interesting range readable.
        figs[name] = _finish(
            fig, ax, f"{metric} vs test context length", "L_te", ylabel, logx=True, clip_top=10.0
        )

    by_depth = _series(rows, "icl_error", "depth", ("method", "context_length"))
    if by_depth:
        longest = max(k[1] for k in by_depth)
        chosen = {k: v for k, v in by_depth.items() if k[1] == longest}
        if any(len(v) > 1 for v in chosen.values()):
            fig, ax = new_figure(6.4, 4.4)
            for (method, _), pts in sorted(chosen.items(), key=lambda kv: str(kv[0])):
                _line(ax, pts, method)
            figs["icl_error_vs_depth"] = _finish(
                fig, ax, f"icl_error vs depth (L_te={longest})", "depth T", "icl_error"
            )

    alpha = _series(rows, "alpha_hat", "layer", ("method",))
    beta = _series(rows, "beta_hat", "layer", ("method",))
    if alpha or beta:
        fig, ax = new_figure(6.4, 4.4)
        for (method,), pts in sorted(alpha.items()):
            _line(ax, pts, f"alpha_hat {method}")
        for (method,), pts in sorted(beta.items()):
            _line(ax, pts, f"beta_hat {method}", linestyle="--")
        stars = [float(r["value"]) for r in rows if r.get("metric") == "alpha_star"]
        if stars:
            a = stars[0]
            ax.axhline(a, color="black", linewidth=1, label=f"alpha* = {a:.4f}")
            ax.axhline(-a, color="black", linewidth=1, linestyle=":", label="-alpha*")
        figs["layer_scalars"] = _finish(
            fig, ax, "layerwise scalar projections", "layer t", "tr(W_t)/d", logy=False
        )

    white = _series(rows, "whitening_residual", "layer", ("method",))
    if white:
        fig, ax = new_figure(6.4, 4.4)
        for (method,), pts in sorted(white.items()):
            _line(ax, pts, method)
        figs["whitening_residual"] = _finish(
            fig, ax, "whitening diagnostic", "layer t", "||X F_t^T/L - I||_F / sqrt(d)"
        )
    return figs

"""The dataset-size sweep of IC-SSL Sec. 4.2 (Fig. 3): accuracy and separation against the number of training
episodes, per method, and where each method's accuracy jumps (the baseline Transformer's "phase transition").

Runs are ordinary ``fit`` + ``test`` runs of ``configs/icssl/features.yaml`` (or any IC-SSL config whose data
module has ``train_episodes``), one per dataset size, method and seed, tested with the representation-metrics
callback's ``rows: true`` so their ``results.json`` hold separation rows too::

    python experiments/icssl_sweep.py runs/icssl_features/version_* --label-ratio 0.03 --out sweep/

writes ``sweep.png`` (accuracy and separation vs dataset size, mean ± sd over seeds) and ``results.json`` /
``results.csv`` (the curves and one ``phase_transition`` row per method) and prints the table.
``experiments/icssl_fig3_sweep.py`` runs the whole sweep and reports it with :func:`pool` and :func:`sweep_report`.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from lit_icl.core.figures import aggregate
from lit_icl.core.results import load_results, provenance, result_row, versions, write_results

Row = dict[str, Any]


def pooled_rows(run_dirs: Iterable[str | Path]) -> list[Row]:
    """All rows of the runs (folders or ``results.json`` files); see :func:`pool`."""
    paths = [Path(run) for run in run_dirs]
    return pool((str(p), load_results(p / "results.json" if p.is_dir() else p)) for p in paths)


def pool(runs: Iterable[tuple[str, dict[str, Any]]]) -> list[Row]:
    """All rows of ``(run name, results)`` pairs; rows without a ``dataset_size`` (the callback's) take their run's."""
    rows: list[Row] = []
    for name, data in runs:
        sizes = {r["dataset_size"] for r in data["rows"] if r.get("dataset_size") is not None}
        size = sizes.pop() if len(sizes) == 1 else None
        for r in data["rows"]:
            rows.append({**r, "dataset_size": r.get("dataset_size", size), "run": name})
    return rows


def curves(rows: Sequence[Row], label_ratio: float) -> dict[str, dict[str, list[tuple[int, float, float, int]]]]:
    """``{metric: {method: [(dataset_size, mean, sd, n), ...]}}`` for ``accuracy`` at ``label_ratio`` and for the
    separation of each model's own embedding (``embeddings == "model"``)."""
    acc = [r for r in rows if r["metric"] == "accuracy" and r.get("label_ratio") == label_ratio
           and r.get("dataset_size") is not None]
    sep = [r for r in rows if r["metric"] == "separation" and r.get("embeddings") == "model"
           and r.get("dataset_size") is not None]
    out: dict[str, dict[str, list[tuple[int, float, float, int]]]] = {}
    for name, subset in (("accuracy", acc), ("separation", sep)):
        table: dict[str, list[tuple[int, float, float, int]]] = {}
        for (method, size), (mean, sd, n) in sorted(aggregate(subset, ["method", "dataset_size"]).items()):
            table.setdefault(method, []).append((int(size), mean, sd, n))
        out[name] = table
    return out


def phase_transition(points: Sequence[tuple[int, float, float, int]]) -> tuple[int, float] | None:
    """The dataset size after the largest rise of the curve between consecutive sizes, and that rise.

    ``None`` for fewer than two sizes, or when the curve never rises (a flat or falling curve, e.g. a model
    still on its loss plateau at every size, has no transition). A sharp transition shows as one rise much
    larger than the others.
    """
    pts = sorted(points)
    if len(pts) < 2:
        return None
    rises = [(b[1] - a[1], b[0]) for a, b in itertools.pairwise(pts)]
    rise, size = max(rises)
    return (size, rise) if rise > 0 else None


def sweep_figure(table: dict[str, dict[str, list[tuple[int, float, float, int]]]], label_ratio: float) -> Figure:
    """Fig. 3's left and middle panels: accuracy and separation vs dataset size (log x), ± 1 sd bands."""
    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    panels = fig.subplots(1, 2)
    for ax, (metric, ylabel) in zip(panels, (("accuracy", f"ICL accuracy ({100 * label_ratio:g} % labels)"),
                                            ("separation", "separation (intra - inter cosine)"))):
        for method, pts in sorted(table.get(metric, {}).items()):
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            sds = [0.0 if math.isnan(p[2]) else p[2] for p in pts]
            ax.plot(xs, ys, marker="o", label=method)
            ax.fill_between(xs, [y - s for y, s in zip(ys, sds)], [y + s for y, s in zip(ys, sds)], alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("dataset size (training episodes)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def sweep_report(rows: Sequence[Row], label_ratio: float, out: str | Path | None = None,
                 runs: Sequence[str] = ()) -> str | None:
    """The sweep's Markdown table (accuracy and separation per method and dataset size, with each accuracy
    curve's phase transition), writing ``sweep.png`` and ``results.json`` / ``.csv`` to ``out`` if given (its ``meta.summary_of``: the runs);
    ``None`` when no run has accuracy rows at ``label_ratio``."""
    table = curves(rows, label_ratio)
    if not table["accuracy"]:
        return None
    result_rows = []
    lines = ["| method | metric | dataset size: mean ± sd (n) | phase transition |",
             "|---|---|---|---|"]
    for metric, per_method in table.items():
        for method, pts in sorted(per_method.items()):
            for size, mean, sd, n in pts:
                result_rows.append(result_row(metric, mean, method=method, dataset_size=size, sd=sd, n=n))
            found = phase_transition(pts)
            if metric == "accuracy" and found is not None:
                result_rows.append(result_row("phase_transition", found[0], method=method, rise=found[1]))
            cells = ", ".join(f"{s}: {m:.3f} ± {0.0 if math.isnan(d) else d:.3f} ({n})" for s, m, d, n in pts)
            where = f"{found[0]} (+{found[1]:.3f})" if found is not None else "-"
            lines.append(f"| {method} | {metric} | {cells} | {where} |")
    if out:
        # ``summary_of`` marks the folder as a summary of other runs, not a run: a grid's tidy table
        # (experiments/tidy.py) leaves it out, though the driver writes it inside the grid's folder. The rest is
        # what a test's results.json records of where its numbers came from: versions, command, commit, machine, date.
        meta = {"summary_of": list(runs), "label_ratio": label_ratio, "versions": versions(), **provenance(),
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write_results(out, result_rows, meta, {"sweep": sweep_figure(table, label_ratio)})
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/icssl_sweep.py", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (or results.json files)")
    parser.add_argument("--label-ratio", type=float, default=0.03)
    parser.add_argument("--out", default=None, help="folder for sweep.png and results.json / results.csv")
    args = parser.parse_args(argv)
    text = sweep_report(pooled_rows(args.runs), args.label_ratio, args.out, [str(r) for r in args.runs])
    if text is None:
        print(f"lit_icl: error: no accuracy rows with a dataset_size at label_ratio={args.label_ratio} in the runs",
              file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Combine the ``results.json`` of several ``test`` runs into one table and one figure.

    python -m lit_icl.report runs/icssl_manifolds/version_1 runs/final_LaplacianEigenmap/version_1 \\
        --out comparison.png

Each argument is a run folder or a ``results.json``. A run is labelled by its ``representation`` (or
``net``) field unless ``--labels`` is given. Prints a Markdown table (one row per run, one column per x value)
and writes a figure with one line per run: the paper-style "accuracy vs label ratio" comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_icl.core.plotting import line_plot_png


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a ``results.json`` (or the one inside a run folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found; pass a run folder written by `python -m lit_icl test`")
    data = json.loads(p.read_text())
    if "results" not in data:
        raise ValueError(f"{p} has no 'results' list; is it a lit_icl results.json?")
    return data


def markdown_table(runs: Sequence[tuple[str, dict[str, Any]]], x: str, y: str) -> str:
    """Rows = runs, columns = the union of x values, cells = y (blank where a run lacks that x)."""
    xs = sorted({row[x] for _, data in runs for row in data["results"]})
    lines = ["| run | " + " | ".join(f"{v:g}" for v in xs) + " |", "|---" * (len(xs) + 1) + "|"]
    for label, data in runs:
        by_x = {row[x]: row[y] for row in data["results"]}
        cells = [f"{by_x[v]:.3f}" if v in by_x else "" for v in xs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders or results.json files")
    parser.add_argument("--labels", nargs="*", help="one label per run (default: the run's representation)")
    parser.add_argument("--x", default="label_ratio", help="x field of each result row")
    parser.add_argument("--y", default="accuracy", help="y field of each result row")
    parser.add_argument("--out", help="write the figure to this PNG file")
    parser.add_argument("--title", default="test accuracy")
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        parser.error(f"--labels has {len(args.labels)} entries for {len(args.runs)} runs")
    try:
        loaded = [load_results(r) for r in args.runs]
    except (FileNotFoundError, ValueError) as err:
        print(f"lit_icl.report: error: {err}", file=sys.stderr)
        sys.exit(2)
    labels = args.labels or [d.get("representation") or d.get("net") or str(r) for d, r in zip(loaded, args.runs)]
    runs = list(zip(labels, loaded))
    print(markdown_table(runs, args.x, args.y))
    if args.out:
        xs = sorted({row[args.x] for _, d in runs for row in d["results"]})
        series = {
            label: [next((row[args.y] for row in d["results"] if row[args.x] == v), float("nan")) for v in xs]
            for label, d in runs
        }
        png = line_plot_png(xs, series, title=args.title, xlabel=args.x, ylabel=args.y)
        Path(args.out).write_bytes(png.getvalue())


if __name__ == "__main__":
    main()

"""Compare two nets' in-context regression errors over seeds, from the ``results.json`` of their ``test`` runs.

    python experiments/coqe_regression_compare.py \\
        --a coqe runs/coqe_s0/version_1 runs/coqe_s1/version_1 runs/coqe_s2/version_1 \\
        --b transformer runs/transformer_s0/version_1 runs/transformer_s1/version_1 runs/transformer_s2/version_1

Runs are paired by position (the i-th run of ``--a`` with the i-th of ``--b``); a pair must have been tested on
the same prompts, which the script checks through least squares' rows (equal within 1e-6). Prints, per test set,
mean ± sd over the runs of each net and of least squares at k = 0, d/2, d and 2d in-context examples, then the
paired difference a - b at the same k (negative: ``a`` lower), then each run's error at the largest k.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(run: str) -> dict[tuple[str, str, int], float]:
    """(method, shift, n_context) -> mse of one test run."""
    rows = json.loads((Path(run) / "results.json").read_text())["rows"]
    return {(r["method"], r["shift"], int(r["n_context"])): float(r["value"]) for r in rows if r["metric"] == "mse"}


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", nargs="+", required=True, metavar=("NAME", "RUN"), help="method name, then its runs")
    p.add_argument("--b", nargs="+", required=True, metavar=("NAME", "RUN"), help="method name, then its runs")
    args = p.parse_args()
    (name_a, *runs_a), (name_b, *runs_b) = args.a, args.b
    if len(runs_a) != len(runs_b) or not runs_a:
        p.error(f"--a has {len(runs_a)} runs and --b {len(runs_b)}; pass the same number (paired by position)")
    a, b = [load(r) for r in runs_a], [load(r) for r in runs_b]
    for i, (ra, rb) in enumerate(zip(a, b)):
        keys = [k for k in ra if k[0] == "least_squares"]
        if not keys or any(abs(ra[k] - rb.get(k, float("nan"))) > 1e-6 for k in keys):
            p.error(f"pair {i} ({runs_a[i]}, {runs_b[i]}) was not tested on the same prompts")
    shifts = sorted({k[1] for k in a[0]}, key=lambda s: (s != "id", s))
    top = max(k[2] for k in a[0])
    ks = sorted({0, top // 4, top // 2, top})  # 0, d/2, d, 2d when prompts hold 2d + 1 points
    head = " | ".join(f"k = {k}" for k in ks)
    print(f"| test set | method | {head} |\n|---|---|{'---|' * len(ks)}")
    for shift in shifts:
        for label, runs, method in ((name_a, a, name_a), (name_b, b, name_b), ("least squares", a, "least_squares")):
            cells = " | ".join(mean_sd([r[(method, shift, k)] for r in runs]) for k in ks)
            print(f"| {shift} | {label} | {cells} |")
    print(f"\nPaired difference {name_a} - {name_b}, mean ± sd over pairs:\n")
    print(f"| test set | {head} |\n|---|{'---|' * len(ks)}")
    for shift in shifts:
        cells = " | ".join(mean_sd([ra[(name_a, shift, k)] - rb[(name_b, shift, k)] for ra, rb in zip(a, b)]) for k in ks)
        print(f"| {shift} | {cells} |")
    print(f"\nPer run, error at k = {top}:\n")
    print(f"| run | {' | '.join(shifts)} |\n|---|{'---|' * len(shifts)}")
    for label, runs, paths in ((name_a, a, runs_a), (name_b, b, runs_b)):
        for r, path in zip(runs, paths):
            print(f"| {label} `{path}` | {' | '.join(f'{r[(label, s, top)]:.3f}' for s in shifts)} |")


if __name__ == "__main__":
    main()

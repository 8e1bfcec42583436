"""Compare two nets' in-context regression errors over seeds, from the ``results.json`` of their ``test`` runs.

    python experiments/coqe_regression_compare.py \\
        --a coqe runs/coqe_s0/version_1 runs/coqe_s1/version_1 runs/coqe_s2/version_1 \\
        --b transformer runs/transformer_s0/version_1 runs/transformer_s1/version_1 runs/transformer_s2/version_1

Runs are paired by position (the i-th run of ``--a`` with the i-th of ``--b``); a pair must have been tested on
the same prompts, which the script checks through least squares' rows (equal within 1e-6). Prints, per test set,
mean ± sd over the runs of each net and of least squares at k = 0, d/2, d and 2d in-context examples, then the
paired difference a - b at the same k (negative: ``a`` lower), then each run's error at the largest k.
``--fig FILE`` also draws Fig. 3 in small: error against k per test set, both nets (mean ± sd over runs) and
the parameter-free baselines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import NoReturn

from lit_icl.core.figures import mean_sd_text
from lit_icl.core.results import load_results
from lit_icl.report import figure_file_problem


def fail(message: str) -> NoReturn:
    """Refuse the command line in one line, status 2."""
    print(f"coqe_regression_compare.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(run: str) -> dict[tuple[str, str, int], float]:
    """(method, shift, n_context) -> mse of one test run."""
    try:
        rows = load_results(run)["rows"]
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    mse = {(r["method"], r["shift"], int(r["n_context"])): float(r["value"])
           for r in rows if r["metric"] == "mse" and "shift" in r and "n_context" in r}
    if not mse:
        fail(f"{run}: no mse rows by shift and n_context; give the test runs of a CoQE regression config")
    return mse


def check_method(option: str, name: str, runs: list[str], loaded: list[dict[tuple[str, str, int], float]]) -> None:
    """Each run of ``option`` must hold rows of its method ``name`` (the ``method`` its results.json records)."""
    for run, rows in zip(runs, loaded):
        methods = sorted({k[0] for k in rows})
        if name not in methods:
            fail(f"{option} {name}: {run} has no rows of method {name!r}; its methods are {', '.join(methods)} "
                 f"(give {option} the method's name, then its runs)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", nargs="+", required=True, metavar=("NAME", "RUN"), help="method name, then its runs")
    p.add_argument("--b", nargs="+", required=True, metavar=("NAME", "RUN"), help="method name, then its runs")
    p.add_argument("--fig", type=Path, default=None, help="also draw error vs k per test set into this PNG")
    p.add_argument("--label-b", default=None, help="legend label of --b (default its name)")
    args = p.parse_args()
    (name_a, *runs_a), (name_b, *runs_b) = args.a, args.b
    problem = figure_file_problem(args.fig) if args.fig is not None else None
    if problem is not None:  # before the tables are printed: a refusal is the only output
        fail(f"--fig {args.fig}: {problem}")
    if len(runs_a) != len(runs_b) or not runs_a:
        fail(f"--a has {len(runs_a)} runs and --b {len(runs_b)}; pass the same number (paired by position)")
    a, b = [load(r) for r in runs_a], [load(r) for r in runs_b]
    check_method("--a", name_a, runs_a, a)
    check_method("--b", name_b, runs_b, b)
    for i, (ra, rb) in enumerate(zip(a, b)):
        keys = [k for k in ra if k[0] == "least_squares"]
        if not keys or any(abs(ra[k] - rb.get(k, float("nan"))) > 1e-6 for k in keys):
            fail(f"pair {i} ({runs_a[i]}, {runs_b[i]}) was not tested on the same prompts (or lacks least squares' "
                 "rows): pair the runs of the same seeds, in the same order")
    shifts = sorted({k[1] for k in a[0]}, key=lambda s: (s != "id", s))
    top = max(k[2] for k in a[0])
    ks = sorted({0, top // 4, top // 2, top})  # 0, d/2, d, 2d when prompts hold 2d + 1 points
    head = " | ".join(f"k = {k}" for k in ks)
    print(f"| test set | method | {head} |\n|---|---|{'---|' * len(ks)}")
    for shift in shifts:
        for label, runs, method in ((name_a, a, name_a), (name_b, b, name_b), ("least squares", a, "least_squares")):
            cells = " | ".join(mean_sd_text([r[(method, shift, k)] for r in runs]) for k in ks)
            print(f"| {shift} | {label} | {cells} |")
    print(f"\nPaired difference {name_a} - {name_b}, mean ± sd over pairs:\n")
    print(f"| test set | {head} |\n|---|{'---|' * len(ks)}")
    for shift in shifts:
        cells = " | ".join(mean_sd_text([ra[(name_a, shift, k)] - rb[(name_b, shift, k)] for ra, rb in zip(a, b)]) for k in ks)
        print(f"| {shift} | {cells} |")
    if args.fig is not None:
        draw(args.fig, shifts, (name_a, a, name_a), (name_b, b, args.label_b or name_b))
    print(f"\nPer run, error at k = {top}:\n")
    print(f"| run | {' | '.join(shifts)} |\n|---|{'---|' * len(shifts)}")
    for label, runs, paths in ((name_a, a, runs_a), (name_b, b, runs_b)):
        for r, path in zip(runs, paths):
            print(f"| {label} `{path}` | {' | '.join(f'{r[(label, s, top)]:.3f}' for s in shifts)} |")


def draw(path: Path, shifts: list[str], *nets: tuple[str, list[dict], str]) -> None:
    """One panel per test set: each net's mean ± sd over its runs against k, and the baselines of the first
    net's runs (they do not depend on the net)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs_a = nets[0][1]
    ks = sorted({k[2] for k in runs_a[0]})
    baselines = sorted({k[0] for k in runs_a[0]} - {name for name, _, _ in nets})
    cols = 4
    rows = -(-len(shifts) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, shift in zip(axes.flat, shifts):
        for method, runs, label, style in [*((n, r, lbl, "-") for n, r, lbl in nets),
                                            *((m, runs_a, m.replace("_", " "), ":") for m in baselines)]:
            values = [[r[(method, shift, k)] for r in runs] for k in ks]
            mean = [statistics.fmean(v) for v in values]
            ax.plot(ks, mean, style, marker="o" if style == "-" else None, markersize=3, label=label)
            if style == "-" and len(runs) > 1:
                sd = [statistics.stdev(v) for v in values]
                ax.fill_between(ks, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)], alpha=0.2)
        ax.set_title(shift, fontsize=9)
        ax.set_yscale("symlog", linthresh=0.1)
        ax.set_xlabel("in-context examples k", fontsize=8)
        ax.set_ylabel("squared error / d", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(shifts):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

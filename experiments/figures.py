"""Figures for the docs pages, drawn from the measured numbers in ``experiments/results/*.csv``.

    python experiments/figures.py all                 # every figure below
    python experiments/figures.py icssl               # docs/figures/icssl_cpu.png
    python experiments/figures.py mmca_synthetic      # docs/figures/mmca_synthetic_cpu.png
    python experiments/figures.py mmca_avmnist        # docs/figures/mmca_avmnist_cpu.png
    python experiments/figures.py i2cl                # docs/figures/i2cl_cpu.png

Each CSV holds, value for value, a table of the Markdown results file of the same name (which names the
command, machine, date and commit that measured it); nothing here is re-measured. ``--results DIR`` and
``--out DIR`` read and write elsewhere (the tests use them).

- ``icssl``: test accuracy against the label ratio on the cylinder, in distribution, every representation and the
  label-only floors (``icssl_cpu_cylinder.csv`` = the first table of ``icssl_cpu.md``).
- ``mmca_synthetic``: ICL error against the test prompt length, linear cross-attention against linear
  self-attention and the other models, with the closed forms as the L -> inf lines (``mmca_synthetic_cpu.csv``
  = the table of ``mmca_synthetic_cpu.md``; the closed forms are that file's, Theorem 4.1 and Lemma D.1).
- ``mmca_avmnist``: best test accuracy of the five Table 1 models at noise sd 0.2 and 1.0, mean ± sd over three
  seeds with each seed's point (``mmca_avmnist_cpu.csv`` = the per-seed columns of ``mmca_avmnist_cpu.md``).
- ``i2cl``: accuracy of each method on the two offline models, mean ± sd over the seeds with each seed's point,
  zero-shot as a line (``i2cl_offline_cpu.csv`` = the per-seed columns of ``i2cl_offline_cpu.md`` and
  ``i2cl_offline_gemma_cpu.md``; a row's ``setting`` names the calibration noise).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
FIGURES = REPO / "docs" / "figures"

#: Closed forms at L -> inf quoted in mmca_synthetic_cpu.md: Theorem 4.1's LSA floor and Lemma D.1's one-parameter
#: LCA at alpha*, T = 10.
LSA_FLOOR, LCA_ALPHA_STAR_T10 = 0.2045, 0.00766
#: Table 1 of the paper (avMNIST itself, not the stand-in), as quoted in mmca_avmnist_cpu.md, by model.
PAPER_TABLE_1 = {"full (inj. & cross-attn)": 63.85, "no injection": 62.72, "no cross-attn": 62.10,
                 "no inj. & no cross-attn": 60.79, "bi-directional CA": 62.72}


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def grouped(rows: list[dict[str, str]], key: str) -> dict[str, list[dict[str, str]]]:
    """Rows by ``row[key]``, in the order each key first appears (the Markdown table's order)."""
    out: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        out[row[key]].append(row)
    return dict(out)


def icssl(results: Path) -> Figure:
    rows = grouped(read_csv(results / "icssl_cpu_cylinder.csv"), "method")
    fig = Figure(figsize=(9.0, 4.8), layout="constrained")
    ax = fig.add_subplot()
    styles = {
        "ORIG+E2E-ICL": {"color": "C0", "marker": "o", "lw": 2.2},
        "EIG+ICL": {"color": "C1", "marker": "s"},
        "ORIG+ICL": {"color": "C2", "marker": "^"},
        "EIG+ICL, unnormalised head": {"color": "C1", "marker": "s", "ls": ":", "mfc": "none"},
        "ORIG+ICL, unnormalised head": {"color": "C2", "marker": "^", "ls": ":", "mfc": "none"},
        "EIG+LR": {"color": "C4", "marker": "D"},
        "labeled-majority vote": {"color": "0.55", "marker": ".", "ls": "--"},
        "class prior": {"color": "k", "ls": "--", "lw": 1.2},
    }
    for label, pts in rows.items():
        name = label.split(" (")[0]
        x = [float(p["label_ratio_pct"]) for p in pts]
        y = [float(p["accuracy"]) for p in pts]
        ax.plot(x, y, label=name, **styles.get(name, {}))
    ax.set_xlabel("labeled points in the episode (%)")
    ax.set_ylabel("test accuracy on the unlabeled points")
    ax.set_xticks([3, 5, 10, 15, 25, 39])
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside right upper")
    ax.set_title("IC-SSL on the cylinder, in distribution (one seed, 2,048 test episodes of 100 points)", fontsize=9)
    return fig


def mmca_synthetic(results: Path) -> Figure:
    rows = grouped(read_csv(results / "mmca_synthetic_cpu.csv"), "method")
    fig = Figure(figsize=(10.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    styles = {
        "one-param LCA T=10": {"color": "C0", "marker": "o", "lw": 2.2},
        "two-param LCA T=10": {"color": "C0", "marker": "s", "ls": "--", "mfc": "none"},
        "single-layer LSA": {"color": "C3", "marker": "o", "lw": 2.2},
        "two-param deep LSA": {"color": "C3", "marker": "s", "ls": "--", "mfc": "none"},
        "sample mean": {"color": "0.4", "marker": ".", "ls": ":"},
        "no S_t, F_0 = 0": {"color": "C2", "marker": "v", "ls": ":"},
    }
    shown = [m for m in rows if m in styles]  # Fig. 2 and the Fig. 5 / 6 controls; Fig. 3's variants stay in the table
    for method in shown:
        pts = rows[method]
        config = pts[0]["config"]
        label = f"{method} ({config})" if config else method
        ax.plot([float(p["L_te"]) for p in pts], [float(p["icl_error"]) for p in pts], label=label, **styles[method])
    ax.axhline(LSA_FLOOR, color="C3", lw=0.9, ls="-.", label=f"LSA floor, closed form ({LSA_FLOOR})")
    ax.axhline(LCA_ALPHA_STAR_T10, color="C0", lw=0.9, ls="-.",
               label=f"LCA at alpha*, T=10, closed form ({LCA_ALPHA_STAR_T10})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(3e-3, 3)
    ax.set_xlabel("test prompt length L_te")
    ax.set_ylabel("ICL error, mean (y_hat - <w, x_q>)^2")
    ax.grid(alpha=0.3, which="both")
    fig.legend(fontsize=8, loc="outside right upper")
    ax.set_title("Latent-factor prompts (trained at L_tr = 100): cross- vs self-attention; "
                 "points above 3 leave the plot", fontsize=9)
    return fig


def mmca_avmnist(results: Path) -> Figure:
    rows = read_csv(results / "mmca_avmnist_cpu.csv")
    noise = sorted({r["noise_std"] for r in rows}, key=float)
    models = list(grouped(rows, "model"))
    fig = Figure(figsize=(9.0, 4.8), layout="constrained")
    axes = fig.subplots(1, len(noise))
    for ax, sd in zip(axes, noise):
        for i, model in enumerate(models):
            seeds = [float(r["best_test_accuracy_pct"]) for r in rows if r["model"] == model and r["noise_std"] == sd]
            mean, spread = statistics.mean(seeds), statistics.stdev(seeds)
            ax.errorbar(i, mean, yerr=spread, fmt="o", ms=9, capsize=5, color=f"C{i}",
                        label="mean ± sd over 3 seeds" if i == 0 else None)
            ax.scatter([i + 0.22] * len(seeds), seeds, color="0.3", s=14, zorder=3,
                       label="one seed" if i == 0 else None)
            if float(sd) == 1.0:
                ax.scatter([i], [PAPER_TABLE_1[model]], marker="_", s=300, lw=2, color="k", zorder=4,
                           label="paper, avMNIST itself (Table 1)" if i == 0 else None)
        ax.set_xticks(range(len(models)), [m.replace(" (inj. & cross-attn)", "\n(inj. & cross-attn)")
                                           .replace(" & no ", " &\nno ").replace("bi-directional", "bi-dir.")
                                           for m in models], fontsize=8)
        ax.set_xlim(-0.6, len(models) - 0.4)
        ax.set_title(f"noise sd {sd}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("best test accuracy over 100 epochs (%)")
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="outside lower center", ncols=3)
    fig.suptitle("Table 1's five models on the avmnist_lite stand-in (not avMNIST), 100 epochs", fontsize=10)
    return fig


def i2cl(results: Path) -> Figure:
    rows = read_csv(results / "i2cl_offline_cpu.csv")
    models = list(grouped(rows, "model"))
    fig = Figure(figsize=(10.0, 4.6), layout="constrained")
    axes = fig.subplots(1, len(models), sharey=True, squeeze=False)[0]
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        # one column per (method, setting); the paper's setting keeps the method's name alone
        columns = list(dict.fromkeys((r["method"], r["setting"]) for r in mine))
        for i, (method, setting) in enumerate(columns):
            seeds = [float(r["accuracy"]) for r in mine if (r["method"], r["setting"]) == (method, setting)]
            mean = statistics.mean(seeds)
            spread = statistics.stdev(seeds) if len(seeds) > 1 else 0.0
            ax.errorbar(i, mean, yerr=spread, fmt="o", ms=8, capsize=4, color=f"C{i}",
                        label="mean ± sd over seeds" if i == 0 else None)
            ax.scatter([i + 0.2] * len(seeds), seeds, color="0.3", s=12, zorder=3, label="one seed" if i == 0 else None)
            if method == "zero-shot":
                ax.axhline(mean, color="0.5", ls="--", lw=1, label="zero-shot")
        labels = [m if s.startswith("paper") else f"{m}\n({s})" for m, s in columns]
        ax.set_xticks(range(len(columns)), labels, fontsize=8, rotation=20)
        ax.set_title(model, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("accuracy, 500 movie-review queries")
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="outside lower center", ncols=3)
    fig.suptitle("I2CL and its baselines on the two offline models (CPU; calibration noise gamma 0.001 unless named)",
                 fontsize=10)
    return fig


FIGURES_BY_NAME: dict[str, Callable[[Path], Figure]] = {
    "icssl": icssl, "mmca_synthetic": mmca_synthetic, "mmca_avmnist": mmca_avmnist, "i2cl": i2cl,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=[*FIGURES_BY_NAME, "all"])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the results CSVs")
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder the PNGs go to")
    args = parser.parse_args(argv)
    names = list(FIGURES_BY_NAME) if args.figure == "all" else [args.figure]
    if not args.results.is_dir():
        parser.error(f"--results {args.results}: no such folder; name the folder of the results CSVs "
                     f"(default {RESULTS.relative_to(RESULTS.parents[1])})")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file; name a folder for the PNGs")
    try:  # every figure is drawn before any is written or a folder made
        figures = {name: FIGURES_BY_NAME[name](args.results) for name in names}
    except FileNotFoundError as err:
        parser.error(f"--results {args.results} lacks {Path(err.filename).name}, which the {args.figure} figure "
                     "reads; name the folder holding the committed results CSVs")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, figure in figures.items():
        path = args.out / f"{name}_cpu.png"
        figure.savefig(path, dpi=110)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

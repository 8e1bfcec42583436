"""Validation ICL and IWL accuracy against training step for CoQE-Omniglot runs, from their TensorBoard events.

Used for the Transformer's learning curves at CPU scale with 200 and with all 1,623 characters (does ICL emerge
given more classes or more steps?)::

    python experiments/coqe_transformer_curves.py \\
        "200 characters=runs/tx200/tx/version_0" "1,623 characters=runs/tx1623/tx/version_0" \\
        --fig docs/figures/coqe_transformer_classes_cpu.png

Each argument is ``label=run folder`` (the folder holding ``events.out.tfevents.*``). Prints, per run, the
validation accuracies every 2,000 steps and writes the figure when ``--fig`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from runner import logged_scalars

TAGS = {"val/acc/icl": "ICL (holdout classes, chance 0.5)", "val/acc/iwl": "IWL (training classes)"}


def curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` for the tags in :data:`TAGS`, over every event file of ``run``."""
    return {tag: sorted(points.items()) for tag, points in logged_scalars(run, TAGS).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="label=run folder")
    parser.add_argument("--fig", type=Path, help="write the figure here")
    parser.add_argument("--every", type=int, default=2000, help="print a value about every this many steps")
    args = parser.parse_args(argv)
    runs = {label: curves(Path(folder)) for label, _, folder in (r.partition("=") for r in args.runs)}
    for label, by_tag in runs.items():
        for tag, points in by_tag.items():
            # the last validation in each block of `every` steps, and the final one
            shown = [(s, v) for i, (s, v) in enumerate(points)
                     if i == len(points) - 1 or s // args.every < points[i + 1][0] // args.every]
            print(f"{label:>20} {tag:12} " + "  ".join(f"{s}:{v:.3f}" for s, v in shown))
    if args.fig:
        fig = Figure(figsize=(9, 3.2), layout="constrained")
        axes = fig.subplots(1, len(TAGS))
        for ax, (tag, title) in zip(axes, TAGS.items()):
            for i, (label, by_tag) in enumerate(runs.items()):
                steps, values = zip(*by_tag[tag]) if by_tag[tag] else ((), ())
                ax.plot([s + 1 for s in steps], values, color=f"C{i}", label=label, lw=1.2)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("training step")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0].axhline(0.5, color="gray", lw=0.8, ls="--")
        axes[0].set_ylabel("validation accuracy")
        axes[-1].legend(fontsize=8)
        args.fig.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.fig, dpi=120)
        print(f"wrote {args.fig}")


if __name__ == "__main__":
    main()

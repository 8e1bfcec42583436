"""CoQE vs the Transformer on Omniglot sequences at CPU scale: run the arms, then tabulate and plot them.

The CoQE paper's Omniglot claims (Fig. 4/5, Table 1) in small, with ``configs/coqe/omniglot.yaml`` and its
overlay ``configs/coqe/omniglot/cpu.yaml`` (28x28 images of 200 characters, narrow nets, 4,000 steps), and
``transformer.yaml`` after it for the baseline::

    python experiments/coqe_omniglot_cpu.py all --out runs/coqe_cpu --seeds 0 1 2 --jobs 2
    python experiments/coqe_omniglot_cpu.py report --out runs/coqe_cpu \\
        --md runs/coqe_cpu/table.md --fig docs/figures/coqe_omniglot_cpu.png

Every arm x seed is one ``python -m lit_icl fit`` run (``runs/coqe_cpu/<arm>/s<seed>``), then one ``test`` of its
last checkpoint (``<arm>/s<seed>_test``), run through ``experiments/runner.py``: ``--jobs`` at a time here, or
as SLURM job arrays with ``--executor slurm``; finished runs are skipped and an interrupted fit resumes from its
``last.ckpt``. CLI overrides for every fit follow ``--`` (``-- --trainer.max_steps 24000``). ``report`` reads
each test's ``results.json`` (from the run folders, or from the tidy CSV that ``report --csv`` writes) and each
fit's TensorBoard curves (``val/acc/icl``, ``val/acc/iwl``, ``val/acc/iwl_static``; the CSV keeps them too) and
writes a Markdown table (mean ± sd over seeds) and a learning-curve figure. ``--md`` writes the table alone,
replacing the file: the results page (``experiments/results/coqe_omniglot_cpu.md``) quotes it beside its
command, machine, date and commit, so give ``--md`` a file of its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from runner import (
    REPO,
    Job,
    add_job_args,
    add_stage_arg,
    drive,
    logger_args,
    parse_driver_args,
    refuse_empty_report,
)
from tidy import add_report_args, check_out, grid_records

from lit_icl.core.figures import mean_sd_text

COQE = ["configs/coqe/omniglot.yaml", "configs/coqe/omniglot/cpu.yaml"]
TRANSFORMER = [*COQE, "configs/coqe/omniglot/transformer.yaml"]
NET = "--model.init_args.net.init_args."

#: arm -> (base config and overlays, extra CLI arguments, what it stands for)
ARMS: dict[str, tuple[list[str], list[str], str]] = {
    "coqe": (COQE, [], "CoQE, noise on every modified query logit (the default rule)"),
    "coqe_noise_free": (COQE, ["--model.init_args.noise", "null"], "CoQE without noise (Table 1, first row)"),
    "coqe_non_context": (
        COQE, [NET + "noise_on", "non_context"], "CoQE, noise on non-context classes only (the earlier rule)"
    ),
    "coqe_public_rule": (
        COQE,
        [NET + "noise_on", "all", NET + "noise_k", "177", NET + "context_logit", "add", NET + "detach_static", "true"],
        "CoQE, the public code's rule (noise on the 177 of 190 smallest static logits, context logit added)",
    ),
    "coqe_lr_decay": (
        COQE, ["--model.init_args.lr_schedule", "warmup_rsqrt", "--model.init_args.warmup_steps", "400"],
        "CoQE, Chan et al.'s warm-up / inverse-sqrt learning rate (peak 3e-4 at step 400, 0.95e-4 at step 4,000)",
    ),
    "transformer_bursty": (TRANSFORMER, [], "Transformer, P_bursty 0.9"),
    "transformer_iid": (TRANSFORMER, ["--data.init_args.p_bursty", "0"], "Transformer, P_bursty 0"),
}
ACCURACIES = ("icl", "iwl", "iwl_static")


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    """One training run per (seed, arm), seed by seed."""
    jobs = []
    for seed in args.seeds:
        for arm in args.arms:
            config, overrides, _ = ARMS[arm]
            argv = ["fit", *[a for path in config for a in ("--config", str(REPO / path))], *overrides, *args.extra,
                    "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
                    "--trainer.enable_progress_bar", "false", *logger_args(args.out, arm, f"s{seed}")]
            jobs.append(Job(f"fit {arm} s{seed}", argv, args.out / arm / f"s{seed}"))
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    """Each fit tested from its last checkpoint, with the config it saved (its arm's overrides included)."""
    jobs = []
    for fit in fit_jobs(args):
        arm, seed = fit.folder.parent.name, fit.folder.name
        folder = fit.folder.parent / f"{seed}_test"
        argv = ["test", "--config", str(fit.folder / "config.yaml"),
                "--ckpt_path", str(fit.folder / "checkpoints" / "last.ckpt"), "--trainer.enable_progress_bar", "false",
                *logger_args(args.out, arm, folder.name)]
        jobs.append(Job(f"test {arm} {seed}", argv, folder, after=[fit.folder]))
    return jobs


def collect(args: argparse.Namespace) -> dict[str, dict[int, dict]]:
    """``{arm: {seed: {"test": {accuracy: value}, "curves": ..., "fit_s": ..., "steps": ...}}}`` for every tested
    run: test accuracies per evaluator, validation curves ``{accuracy: [(step, value)]}``,
    the fit's wall-clock seconds and the steps its checkpoint trained."""
    records = grid_records(args, {f"val/acc/{a}": None for a in ACCURACIES})
    found: dict[str, dict[int, dict]] = {}
    for arm in ARMS:
        for seed in args.seeds:
            test, fit = records.get(f"{arm}/s{seed}_test"), records.get(f"{arm}/s{seed}")
            if test is None or test.results is None:
                continue
            logged = fit.scalars if fit is not None else {}
            curves = {a: sorted(logged[f"val/acc/{a}"].items()) for a in ACCURACIES if logged.get(f"val/acc/{a}")}
            found.setdefault(arm, {})[seed] = {
                "test": {r["evaluator"]: r["value"] for r in test.results["rows"] if r["metric"] == "accuracy"},
                "curves": curves, "fit_s": fit.wall if fit is not None else None,
                "steps": test.results["meta"].get("trained_steps"),
            }
    return found


def dominated_by(point: tuple[float, float], others: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points of ``others`` at least as good on both axes and better on one (Pareto dominance)."""
    return [o for o in others if o[0] >= point[0] and o[1] >= point[1] and o != point]


def table(found: dict[str, dict[int, dict]]) -> str:
    lines = [
        "| arm | seeds | ICL (test) | IWL evaluator (test) | IWL, static head alone (test) | steps | fit wall-clock (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, seeds in found.items():
        cells = [mean_sd_text([s["test"][a] for s in seeds.values() if a in s["test"]]) for a in ACCURACIES]
        fit = [s["fit_s"] for s in seeds.values() if s["fit_s"] is not None]
        steps = sorted({s["steps"] for s in seeds.values()})
        fit_cell = f"{min(fit):.0f}-{max(fit):.0f}" if fit else "-"
        lines.append(
            f"| `{arm}` | {', '.join(map(str, seeds))} | {' | '.join(cells)} | "
            f"{', '.join(map(str, steps))} | {fit_cell} |"
        )
    lines.append("")
    lines.append("Per seed (ICL / IWL evaluator / IWL static head):")
    lines.append("")
    for arm, seeds in found.items():
        per = "; ".join(
            f"seed {k}: " + " / ".join(f"{s['test'].get(a, float('nan')):.3f}" for a in ACCURACIES)
            for k, s in seeds.items()
        )
        lines.append(f"- `{arm}`: {per}")
    transformer = [
        (s["test"]["icl"], s["test"]["iwl"]) for arm, seeds in found.items() if arm.startswith("transformer")
        for s in seeds.values()
    ]
    if "coqe" in found and transformer:
        lines += ["", "Pareto check (ICL, IWL evaluator) of each CoQE seed against every Transformer run:", ""]
        for k, s in found["coqe"].items():
            p = (s["test"]["icl"], s["test"]["iwl"])
            dom = dominated_by(p, transformer)
            verdict = "dominated by " + ", ".join(f"({a:.3f}, {b:.3f})" for a, b in dom) if dom else "not dominated"
            lines.append(f"- CoQE seed {k} ({p[0]:.3f}, {p[1]:.3f}): {verdict}")
    return "\n".join(lines) + "\n"


def figure(found: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"icl": "ICL evaluator", "iwl": "IWL evaluator", "iwl_static": "IWL, CoQE's static head alone"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6), sharey=True)
    colors = {arm: f"C{i}" for i, arm in enumerate(ARMS)}  # one colour per arm in every panel
    handles = {}
    for ax, acc in zip(axes, ACCURACIES):
        for arm, seeds in found.items():
            curves = [s["curves"][acc] for s in seeds.values() if acc in s["curves"]]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            steps = [c[0] for c in curves[0][:n]]
            mean = [statistics.mean(c[i][1] for c in curves) for i in range(n)]
            (line,) = ax.plot(steps, mean, color=colors[arm])
            handles[arm] = (line, f"{arm} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
        ax.set_title(titles[acc])
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy (mean over seeds)")
    axes[0].set_ylim(0, 1.02)
    if handles:
        fig.legend(*zip(*handles.values()), loc="lower center", ncol=min(len(handles), 4), fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(args: argparse.Namespace) -> str:
    """The table (also written to ``--md``) and, with ``--fig``, the learning-curve figure."""
    found = collect(args)
    if not found:
        return refuse_empty_report(args)
    text = table(found)
    if args.md:
        args.md.write_text(text)
    if args.fig:
        if not any(s["curves"].get(acc) for seeds in found.values() for s in seeds.values() for acc in ACCURACIES):
            print(f"note: {args.fig}: the fits logged no validation round, so the figure has axes but no curves "
                  "(a fit validates every --trainer.val_check_interval steps)", file=sys.stderr)
        figure(found, args.fig)
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stage_arg(parser)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "coqe_cpu")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--md", type=Path, help="report: also write the table here")
    parser.add_argument("--fig", type=Path, help="report: write the learning-curve figure here")
    add_job_args(parser)
    add_report_args(parser)
    parser.epilog = "Anything after -- goes to every fit as CLI overrides, e.g. -- --trainer.max_steps 24000."
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parse_driver_args(parser, argv[:cut], __file__)
    args.argv, args.extra = argv, argv[cut + 1:]  # the whole command line, for the rerun command
    args.out = args.out.resolve()
    check_out(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    drive(parse_args(argv), fit_jobs, test_jobs, report, parse_args)


if __name__ == "__main__":
    main()

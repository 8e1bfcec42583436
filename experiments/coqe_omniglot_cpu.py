"""CoQE vs the Transformer on Omniglot sequences at CPU scale: run the arms, then tabulate and plot them.

The CoQE paper's Omniglot claims (Fig. 4/5, Table 1) in small, with ``configs/coqe/omniglot.yaml`` and its
overlay ``configs/coqe/omniglot/cpu.yaml`` (28x28 images of 200 characters, narrow nets, 4,000 steps), and
``transformer.yaml`` after it for the baseline::

    python experiments/coqe_omniglot_cpu.py run --out runs/coqe_cpu --seeds 0 1 2 --jobs 2
    python experiments/coqe_omniglot_cpu.py report --out runs/coqe_cpu \\
        --md experiments/results/coqe_omniglot_cpu.md --fig docs/figures/coqe_omniglot_cpu.png

``run`` trains and tests every arm x seed as ``python -m lit_icl fit`` then ``test`` subprocesses (one thread
each, ``--jobs`` at a time) and records their wall times. An arm whose test results exist is skipped, and a fit
with a ``last.ckpt`` resumes from it (exactly: the CLI's resume), so an interrupted sweep picks up where it
stopped. ``report`` reads each fit run's TensorBoard curves (``val/acc/icl``, ``val/acc/iwl``,
``val/acc/iwl_static``) and each test run's ``results.json`` and writes a Markdown table (mean ± sd over
seeds) and a learning-curve figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def run_one(out: Path, arm: str, seed: int, extra: list[str]) -> str:
    """fit, then test on the fit's last checkpoint; returns a one-line status."""
    config, args, _ = ARMS[arm]
    folder = out / arm / f"seed{seed}"
    if _test_results(folder) is not None:
        return f"{arm} seed {seed}: done already"
    folder.mkdir(parents=True, exist_ok=True)
    configs = [arg for path in config for arg in ("--config", path)]
    common = [
        *configs, *args, *extra, "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
        "--trainer.logger.init_args.save_dir", str(folder), "--trainer.logger.init_args.name", arm,
        "--trainer.enable_progress_bar", "false",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    times = {}
    for stage in ("fit", "test"):
        cmd = [sys.executable, "-m", "lit_icl", stage, *common]
        last = _last_checkpoint(folder)
        if last is not None:  # fit: resume an interrupted run; test: the trained weights
            cmd += ["--ckpt_path", str(last)]
        elif stage == "test":
            return f"{arm} seed {seed}: fit wrote no checkpoint; see {folder / 'fit.log'}"
        start = time.time()
        with open(folder / f"{stage}.log", "a") as log:
            proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        times[f"{stage}_s"] = round(time.time() - start, 1)
        if proc.returncode:
            return f"{arm} seed {seed}: {stage} failed (exit {proc.returncode}); see {folder / (stage + '.log')}"
    (folder / "times.json").write_text(json.dumps(times))
    return f"{arm} seed {seed}: fit {times['fit_s']:.0f} s, test {times['test_s']:.0f} s"


def _last_checkpoint(folder: Path) -> Path | None:
    """The newest ``last.ckpt`` of a run folder (a resumed fit writes into the next version)."""
    found = sorted(folder.glob("*/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _test_results(folder: Path) -> dict | None:
    found = sorted(folder.glob("*/version_*/results.json"))
    return json.loads(found[-1].read_text()) if found else None


def _curves(folder: Path) -> tuple[dict[str, list[tuple[int, float]]], float]:
    """Validation curves ``{accuracy: [(step, value)]}`` and the training wall time in seconds.

    The wall time runs from the first logged training step to the last validation of each fit version
    (summed over versions, so a resumed run counts only the time it trained; start-up is not included).
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves: dict[str, dict[int, float]] = {}
    seconds = 0.0
    for run in sorted(folder.glob("*/version_*")):  # a resumed fit continues its curves in the next version
        acc = EventAccumulator(str(run))
        acc.Reload()
        tags = acc.Tags()["scalars"]
        for a in ACCURACIES:
            if f"val/acc/{a}" in tags:
                curves.setdefault(a, {}).update({e.step: e.value for e in acc.Scalars(f"val/acc/{a}")})
        if "train/loss" in tags and "val/acc/icl" in tags:
            seconds += max(0.0, acc.Scalars("val/acc/icl")[-1].wall_time - acc.Scalars("train/loss")[0].wall_time)
    return {a: sorted(points.items()) for a, points in curves.items()}, seconds


def collect(out: Path) -> dict[str, dict[int, dict]]:
    """``{arm: {seed: {"test": {accuracy: value}, "curves": ..., "times": ...}}}`` for every finished run."""
    found: dict[str, dict[int, dict]] = {}
    for arm in ARMS:
        for folder in sorted((out / arm).glob("seed*")):
            results = _test_results(folder)
            if results is None:
                continue
            test = {r["evaluator"]: r["value"] for r in results["rows"] if r["metric"] == "accuracy"}
            times = json.loads((folder / "times.json").read_text()) if (folder / "times.json").exists() else {}
            curves, train_s = _curves(folder)
            if train_s:
                times["train_s"] = train_s
            steps = results["meta"].get("trained_steps")
            found.setdefault(arm, {})[int(folder.name[4:])] = {
                "test": test, "curves": curves, "times": times, "steps": steps,
            }
    return found


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def dominated_by(point: tuple[float, float], others: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points of ``others`` at least as good on both axes and better on one (Pareto dominance)."""
    return [o for o in others if o[0] >= point[0] and o[1] >= point[1] and o != point]


def table(found: dict[str, dict[int, dict]]) -> str:
    lines = [
        "| arm | seeds | ICL (test) | IWL evaluator (test) | IWL, static head alone (test) | steps | training time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, seeds in found.items():
        cells = [_mean_sd([s["test"][a] for s in seeds.values() if a in s["test"]]) for a in ACCURACIES]
        fit = [s["times"].get("train_s", s["times"].get("fit_s")) for s in seeds.values()]
        fit = [f for f in fit if f is not None]
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and test arms x seeds")
    run.add_argument("--out", type=Path, default=Path("runs/coqe_cpu"))
    run.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    run.add_argument("extra", nargs=argparse.REMAINDER, help="more CLI overrides after --, for every run")
    rep = sub.add_parser("report", help="table and figure from finished runs")
    rep.add_argument("--out", type=Path, default=Path("runs/coqe_cpu"))
    rep.add_argument("--md", type=Path, help="write the table here (printed otherwise)")
    rep.add_argument("--fig", type=Path, help="write the learning-curve figure here")
    args = parser.parse_args(argv)
    if args.command == "run":
        extra = [a for a in args.extra if a != "--"]
        jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for line in pool.map(lambda job: run_one(args.out.resolve(), job[0], job[1], extra), jobs):
                print(line, flush=True)
        return
    found = collect(args.out)
    if not found:
        raise SystemExit(f"no finished runs under {args.out}; start them with `run` first")
    text = table(found)
    if args.md:
        args.md.write_text(text)
    else:
        print(text)
    if args.fig:
        figure(found, args.fig)


if __name__ == "__main__":
    main()

"""Run the IC-SSL paper's multi-seed tables (Tables 2-6) from the shipped configs, resumably, and report them.

    python experiments/icssl_paper_tables.py fit --steps 300 --seeds 0 1 2 --jobs 2    # train every model
    python experiments/icssl_paper_tables.py test --jobs 2                               # test every model
    python experiments/icssl_paper_tables.py report > icssl_tables.md                   # mean +- sd tables

Every job is one ``python -m lit_icl fit|test`` subprocess with the command line printed in its log, so any
single number can be re-run by hand. A job whose ``done`` marker exists is skipped; a ``fit`` killed half-way
resumes from its ``last`` checkpoint; so the whole grid can be stopped and restarted at any point.

The grid (``--out``, default ``runs/icssl_tables``), per seed:

* Tables 2-4 (App. F.3): for each head kernel (``rbf``, ``linear``) and each model -- ORIG+E2E-ICL in the tuned
  default (``tuned``) and the paper-faithful configuration (``faithful``), and EIG+ICL with each
  configuration's GD head (``eig``, ``eig_faithful``) -- five models trained on one manifold each (ID as
  Sec. 4.3.1: ``only_<manifold>``), one trained on all five (ID with every manifold seen: ``five``, tested on
  each) and five leave-one-out models trained on four (OOD: ``no_<manifold>``, tested on the fifth).
* Table 5 (App. F.4): the RBF leave-one-out models tested zero-shot on the image-manifold test sequences
  (OOD), against models trained on the image-manifold training sequences (ID). The image data is the offline
  stand-in unless ``--image-root`` points to Stable Diffusion sequences.
* Table 6 (App. F.8): the product manifold with the full model, the 1-layer Lap+PE and the linear Laplacian.

``--steps`` is the training budget of every model (``--eig-steps`` sets EIG+ICL's apart: it trains only its
head). Tests use ``--test-episodes`` episodes per test manifold at 3, 21 and 39 labels (Tables 2-5; 3 to 80
for Table 6).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
MANIFOLDS = ("cone", "cylinder", "sphere", "torus", "spiral")  # App. E.1; "spiral" is the Swiss roll
TABLE_RATIOS = "[0.03, 0.21, 0.39]"  # 3, 21 and 39 labeled points of 100: Tables 2-5's context sizes
REP = "--model.init_args.net.init_args.representation"
HEAD = "--model.init_args.net.init_args.head.init_args"
EIG = "lit_icl.icssl.LaplacianEigenmap"

#: model -> (config files under configs/: a base and its overlay, extra fit arguments). EIG+ICL swaps the
#: representation for the exact eigenmap (App. D) and keeps the configuration's GD head, so each E2E model is
#: compared with the same head on exact features.
MANIFOLDS_BASE = "icssl/manifolds.yaml"
FAITHFUL = (MANIFOLDS_BASE, "icssl/manifolds/faithful.yaml")
MODELS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "tuned": ((MANIFOLDS_BASE,), []),
    "faithful": (FAITHFUL, []),
    "eig": ((MANIFOLDS_BASE,), [REP, EIG]),
    "eig_faithful": (FAITHFUL, [REP, EIG]),
}
PRODUCT_MODELS = {  # Table 6
    "product_ours": ("icssl/product.yaml",),
    "product_one_layer": ("icssl/product.yaml", "icssl/product/one_layer.yaml"),
    "product_lap_linear": ("icssl/product.yaml", "icssl/product/lap_linear.yaml"),
}
IMAGE_MANIFOLDS = "icssl/image_manifolds.yaml"


def _configs(files: tuple[str, ...]) -> list[str]:
    """``--config`` once per file of ``configs/`` (a base, then its overlay: LightningCLI merges them in order)."""
    return [arg for f in files for arg in ("--config", str(CONFIGS / f))]


@dataclass
class Job:
    """One ``python -m lit_icl`` call; ``folder`` is its run folder, where ``done`` marks success."""

    name: str
    argv: list[str]
    folder: Path
    after: list[Path] = field(default_factory=list)  # folders whose ``done`` this job needs

    @property
    def done(self) -> bool:
        return (self.folder / "done").is_file()


def _logger(out: Path, name: str, version: str) -> list[str]:
    return [
        "--trainer.logger.init_args.save_dir", str(out),
        "--trainer.logger.init_args.name", name,
        "--trainer.logger.init_args.version", version,
    ]


def _budget(steps: int, epochs: int) -> list[str]:
    per_epoch = max(steps // epochs, 1)
    return ["--trainer.max_epochs", str(epochs), "--data.init_args.train_batches_per_epoch", str(per_epoch)]


def _model_section(config: tuple[str, ...], out: Path) -> Path:
    """The ``model:`` part of a shipped config (a base and its overlay merged) as a file, for ``--model <file>``."""
    import yaml

    def merge(a: dict, b: dict) -> dict:
        return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                        for k, v in b.items()}}

    model: dict = {}
    for f in config:
        model = merge(model, yaml.safe_load((CONFIGS / f).read_text()).get("model") or {})
    path = out / "_models" / ("_".join(Path(f).with_suffix("").as_posix().replace("/", "_") for f in config) + ".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(model, sort_keys=False))
    return path


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    """Every training run of the grid, most informative first (RBF, then Table 6, images, linear)."""
    out = args.out
    jobs: list[Job] = []

    def add(name: str, seed: int, argv: list[str]) -> None:
        folder = out / name / f"s{seed}"
        seeds = ["--seed_everything", str(seed), "--data.init_args.data_seed", str(seed)]
        jobs.append(Job(f"fit {name} s{seed}", ["fit", *argv, *seeds, *_logger(out, name, f"s{seed}")], folder))

    for kernel in ("rbf", "linear"):
        for seed in args.seeds:
            for model, (config, extra) in MODELS.items():
                steps = args.eig_steps if model.startswith("eig") else args.steps
                # ID as Sec. 4.3.1 (train on the test manifold alone), ID on all five, OOD (leave one out).
                trainings = [(f"only_{m}", [m]) for m in MANIFOLDS] + [("five", list(MANIFOLDS))]
                trainings += [(f"no_{m}", [x for x in MANIFOLDS if x != m]) for m in MANIFOLDS]
                for suffix, train in trainings:
                    name = f"{model}_{kernel}_{suffix}"
                    add(name, seed, [
                        *_configs(config), *extra, f"{HEAD}.kernel", kernel,
                        "--data.init_args.train_manifolds", str(train),
                        "--data.init_args.val_manifolds", str(train),
                        "--data.init_args.val_episodes", str(args.val_episodes),
                        *_budget(steps, args.epochs),
                    ])
        if kernel == "rbf":
            for seed in args.seeds:
                for name, config in PRODUCT_MODELS.items():
                    add(name, seed, [*_configs(config),
                                     "--data.init_args.val_episodes", str(args.val_episodes),
                                     *_budget(args.steps, args.epochs)])
                for model, (config, extra) in MODELS.items():
                    steps = args.eig_steps if model.startswith("eig") else args.steps
                    # The image data module with this model's net: the net comes from the manifold config.
                    add(f"{model}_rbf_images", seed, [
                        "--config", str(CONFIGS / IMAGE_MANIFOLDS),
                        "--model", str(_model_section(config, out)), *extra,
                        *([f"{REP}.init_args.n_neighbors", "4"] if model.startswith("eig") else []),
                        "--data.init_args.root", str(args.image_root),
                        *_budget(steps, args.epochs),
                    ])
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    """The tests of every trained model: its synthetic test manifold(s), and the image manifolds for Table 5."""
    out = args.out
    jobs: list[Job] = []
    common = ["--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false"]
    for fit in fit_jobs(args):
        name, seed = fit.folder.parent.name, fit.folder.name
        ckpt = ["--ckpt_path", str(fit.folder / "checkpoints" / "last.ckpt")]

        def add(what: str, argv: list[str], fit: Job = fit, name: str = name, seed: str = seed,
                ckpt: list[str] = ckpt) -> None:
            folder = out / name / f"{seed}_test_{what}"
            argv = ["test", *argv, *ckpt, *common, *_logger(out, name, folder.name)]
            jobs.append(Job(f"test {name} {seed} on {what}", argv, folder, after=[fit.folder]))

        own = ["--config", str(fit.folder / "config.yaml")]
        if name.startswith("product_"):
            add("product", [*own, "--data.init_args.test_episodes", str(args.test_episodes)])
            continue
        if name.endswith("_images"):
            add("images", own)
            continue
        held_out = name.rsplit("_no_", 1)[1] if "_no_" in name else None
        tested = list(MANIFOLDS) if name.endswith("_five") else [name.rsplit("_", 1)[1]]
        add("manifolds", [*own, "--data.init_args.test_manifolds", str(tested),
                          "--data.init_args.test_episodes", str(args.test_episodes),
                          "--data.init_args.eval_label_ratios", TABLE_RATIOS])
        if held_out is not None and "_rbf_" in name:  # Table 5's OOD: zero-shot on the image manifolds
            add("images", ["--config", str(CONFIGS / IMAGE_MANIFOLDS),
                           "--data.init_args.root", str(args.image_root)])
    return jobs


def _accuracies(out: Path, name: str, what: str, seeds: list[int]) -> dict[tuple, list[float]]:
    """``{(method kind, manifold, n_labeled): [accuracy per seed]}`` from the test runs of one model.

    ``method kind`` is ``model`` for the trained model and ``class_prior`` for the constant-class floor.
    """
    import json

    found: dict[tuple, list[float]] = {}
    for seed in seeds:
        path = out / name / f"s{seed}_test_{what}" / "results.json"
        if not path.is_file():
            continue
        for row in json.loads(path.read_text())["rows"]:
            if row["metric"] != "accuracy" or row["method"] == "labeled_majority":
                continue
            kind = "class_prior" if row["method"] == "class_prior" else "model"
            found.setdefault((kind, row.get("manifold"), row.get("n_labeled")), []).append(row["value"])
    return found


def _mean_sd(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return m, sd


def _cell(values: list[float] | None, paper: list[float] | None = None, seeds: int = 3) -> str:
    if not values:
        text = "--"
    else:
        m, sd = _mean_sd(values)
        text = f"{m:.3f} ± {sd:.3f}" + ("" if len(values) == seeds else f" (n={len(values)})")
    return text if paper is None else f"{text} ({paper[0]:.3f})"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def report(args: argparse.Namespace) -> str:
    """Tables 2-6 as Markdown: our mean ± sd over the seeds, the paper's mean in parentheses."""
    import json

    paper = json.loads((Path(__file__).with_name("icssl_paper_numbers.json")).read_text())
    out, seeds, n = args.out, args.seeds, len(args.seeds)
    parts = [(f"Accuracy on the unlabeled points, mean ± sd over seeds {seeds} (paper's mean in parentheses); "
              f"E2E models trained {args.steps} steps, EIG+ICL heads {args.eig_steps}; {args.test_episodes} "
              "test episodes per manifold.")]
    margins = []
    for config, eig in (("tuned", "eig"), ("faithful", "eig_faithful")):
        for ctx in (3, 21, 39):
            rows = []
            for kernel in ("linear", "rbf"):
                for m in MANIFOLDS:
                    ref = paper["tables_2_4"][f"{kernel}/{m}/{ctx}"]
                    cells, got, priors = [], {}, []
                    # ID as the paper (trained on this manifold alone), ID on all five, OOD (the other four).
                    for col, model, train in (
                        ("eig_id", eig, f"only_{m}"), ("eig_id5", eig, "five"), ("eig_ood", eig, f"no_{m}"),
                        ("e2e_id", config, f"only_{m}"), ("e2e_id5", config, "five"), ("e2e_ood", config, f"no_{m}"),
                    ):
                        acc = _accuracies(out, f"{model}_{kernel}_{train}", "manifolds", seeds)
                        where = m if train == "five" else None
                        got[col] = acc.get(("model", where, ctx))
                        priors.append(acc.get(("class_prior", where, ctx)))
                        cells.append(_cell(got[col], ref.get(col), n))
                    # The floor of a constant class (any run's test set of this manifold; most seeds wins).
                    prior = max(priors, key=lambda v: len(v or []))
                    rows.append([f"{kernel}-{m}", *cells, _cell(prior, None, n)])
                    for split in ("id", "id5", "ood"):
                        if got[f"e2e_{split}"] and got[f"eig_{split}"]:
                            ours = _mean_sd(got[f"e2e_{split}"])[0] - _mean_sd(got[f"eig_{split}"])[0]
                            paper_e2e = ref.get(f"e2e_{split}")
                            theirs = paper_e2e[0] - ref[f"eig_{split}"][0] if paper_e2e else None
                            margins.append((config, kernel, ctx, split, ours, theirs))
            parts.append(f"### Tables 2-4, {ctx} labeled points, {config} configuration\n\n" + _table(
                ["kernel-target", "EIG+ICL (ID)", "EIG+ICL (ID, five)", "EIG+ICL (OOD)", "E2E ICL (ID)",
                 "E2E ICL (ID, five)", "E2E ICL (OOD)", "class prior"], rows))
    if margins:  # (config, kernel, ctx, split, ours, paper or None), one per manifold
        rows = []
        names = {"id": "ID", "id5": "ID, five", "ood": "OOD"}
        for config, kernel, split in itertools.product(("tuned", "faithful"), ("linear", "rbf"), names):
            cells = []
            for ctx in (3, 21, 39):
                sel = [x for x in margins if x[:4] == (config, kernel, ctx, split)]
                ours = f"{100 * sum(x[4] for x in sel) / len(sel):+.1f}" if sel else "--"
                theirs = [x[5] for x in sel if x[5] is not None]
                cells.append(ours + (f" ({100 * sum(theirs) / len(theirs):+.1f})" if theirs else ""))
            if any(c != "--" for c in cells):
                rows.append([config, kernel, names[split], *cells])
        parts.append("### E2E ICL minus EIG+ICL, accuracy points, mean over the manifolds with both (paper)\n\n"
                     + _table(["config", "kernel", "split", "3 labels", "21 labels", "39 labels"], rows))
    for config, eig in (("tuned", "eig"), ("faithful", "eig_faithful")):
        rows = []
        for ctx in (3, 21, 39):
            id_eig = _accuracies(out, f"{eig}_rbf_images", "images", seeds).get(("model", None, ctx))
            id_e2e = _accuracies(out, f"{config}_rbf_images", "images", seeds).get(("model", None, ctx))
            for m in MANIFOLDS:
                ref = paper["table_5"][f"{m}/{ctx}"]
                ood_eig = _accuracies(out, f"{eig}_rbf_no_{m}", "images", seeds).get(("model", None, ctx))
                ood_e2e = _accuracies(out, f"{config}_rbf_no_{m}", "images", seeds).get(("model", None, ctx))
                rows.append([str(ctx), ",".join(x for x in MANIFOLDS if x != m),
                             _cell(id_eig, ref["eig_id"], n), _cell(ood_eig, ref["eig_ood"], n),
                             _cell(id_e2e, ref["e2e_id"], n), _cell(ood_e2e, ref["e2e_ood"], n)])
        parts.append(f"### Table 5 (RBF, image manifolds: {args.image_root.name}), {config} configuration\n\n"
                     + _table(["labels", "training manifolds (OOD)", "EIG+ICL (ID)", "EIG+ICL (OOD)",
                               "E2E ICL (ID)", "E2E ICL (OOD)"], rows))
    rows = []
    for ctx in (3, 5, 10, 15, 20, 40, 80):
        ref = paper["table_6"][str(ctx)]
        rows.append([str(ctx), *(
            _cell(_accuracies(out, model, "product", seeds).get(("model", None, ctx)), ref[model], n)
            for model in PRODUCT_MODELS)])
    parts.append("### Table 6 (product manifold, 5 factors)\n\n" + _table(
        ["labels", "Lap+PE (1 layer)", "our model", "Lap (linear)"],
        [[r[0], r[2], r[1], r[3]] for r in rows]))
    return "\n\n".join(parts)


def run_job(job: Job, threads: int, dry: bool) -> tuple[Job, int, float]:
    cmd = [sys.executable, "-m", "lit_icl", *job.argv]
    if job.argv[0] == "fit" and (job.folder / "checkpoints" / "last.ckpt").is_file():
        cmd += ["--ckpt_path", "last"]  # an interrupted fit resumes where its last checkpoint left it
    line = " ".join(shlex.quote(c) for c in cmd)
    if dry:
        print(line, flush=True)
        return job, 0, 0.0
    job.folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    with open(job.folder / f"{job.argv[0]}.log", "a") as log:
        log.write(f"$ {line}\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if rc == 0:
        (job.folder / "done").write_text(f"{time.perf_counter() - start:.1f} s\n")
    return job, rc, time.perf_counter() - start


def run_job_in_process(job: Job, threads: int) -> tuple[Job, int, float]:
    """A ``test`` job inside a forked worker that imported Lightning once (saves ~10 s of imports per job)."""
    import contextlib
    import traceback

    import torch

    from lit_icl.cli import main as cli_main

    torch.set_num_threads(threads)
    job.folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(job.folder / f"{job.argv[0]}.log", "a") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        print("$ python -m lit_icl " + " ".join(shlex.quote(c) for c in job.argv), flush=True)
        import logging

        for name in ("lightning.pytorch", "lightning.fabric", "lit_icl"):  # their handlers hold the old stderr
            logging.getLogger(name).handlers = [logging.StreamHandler(log)]
        try:
            cli_main(job.argv)
            rc = 0
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # noqa: BLE001 - reported in the job's log, counted as a failure
            traceback.print_exc()
            rc = 1
    if rc == 0:
        (job.folder / "done").write_text(f"{time.perf_counter() - start:.1f} s\n")
    return job, rc, time.perf_counter() - start


def _in_process_star(item: tuple[Job, int]) -> tuple[Job, int, float]:
    return run_job_in_process(*item)


def run_all(jobs: list[Job], args: argparse.Namespace) -> int:
    todo = [j for j in jobs if not j.done]
    blocked = [j for j in todo if not all((f / "done").is_file() for f in j.after)]
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} done, {len(todo) - len(blocked)} to run with {args.jobs} "
          "at a time", flush=True)
    if blocked:
        print(f"{len(blocked)} wait for runs that have not finished (run `fit` first), e.g. {blocked[0].name}")
        todo = [j for j in todo if j not in blocked]
    failed = 0
    if args.stage == "test" and not args.dry_run and todo:
        import multiprocessing

        import lit_icl.cli  # noqa: F401 - imported once here, inherited by the forked workers

        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.jobs, maxtasksperchild=20) as pool:
            results = pool.imap_unordered(_in_process_star, [(j, args.threads) for j in todo])
            for job, rc, secs in results:
                status = "ok" if rc == 0 else f"FAILED rc={rc} (see {job.folder}/{job.argv[0]}.log)"
                print(f"{time.strftime('%H:%M:%S')} {job.name}: {status}, {secs:.0f} s", flush=True)
                failed += rc != 0
        return failed
    with ThreadPoolExecutor(args.jobs) as pool:
        for job, rc, secs in pool.map(lambda j: run_job(j, args.threads, args.dry_run), todo):
            if not args.dry_run:
                status = "ok" if rc == 0 else f"FAILED rc={rc} (see {job.folder}/{job.argv[0]}.log)"
                print(f"{time.strftime('%H:%M:%S')} {job.name}: {status}, {secs:.0f} s", flush=True)
            failed += rc != 0
    return failed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("fit", "test", "report"))
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "icssl_tables")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="training steps of each E2E model")
    parser.add_argument("--eig-steps", type=int, default=None,
                        help="training steps of each EIG+ICL head (default: --steps, the same budget)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (validation + checkpoint) per run")
    parser.add_argument("--val-episodes", type=int, default=128)
    parser.add_argument("--test-episodes", type=int, default=512)
    parser.add_argument("--image-root", type=Path, default=REPO / "data" / "image_manifolds_standin")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--only", default="", help="only jobs whose name contains this")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    if args.eig_steps is None:
        # The unnormalised Eq. 6 head needs more than 100 steps to leave the constant answer it starts in.
        args.eig_steps = args.steps
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.stage == "report":
        print(report(args))
        return
    jobs = fit_jobs(args) if args.stage == "fit" else test_jobs(args)
    jobs = [j for j in jobs if args.only in j.name]
    sys.exit(1 if run_all(jobs, args) else 0)


if __name__ == "__main__":
    main()

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
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from runner import (
    REPO,
    Job,
    add_convergence_args,
    add_job_args,
    add_overlay_arg,
    add_stage_arg,
    best_checkpoint,
    check_convergence_args,
    chosen_seeds,
    drive,
    given_options,
    logger_args,
    markdown_table,
    mean_sd,
    overlay_argv,
    parse_driver_args,
    positive_int,
    ran_values,
    refuse_empty_report,
    select,
    unused_options_note,
)
from tidy import RunRecord, add_report_args, check_out, grid_records

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
#: Where runs build the image-manifold stand-in on first use (lit_icl.icssl.image_manifolds.STANDIN_ROOT).
DEFAULT_IMAGE_ROOT = REPO / "data" / "image_manifolds_standin"
#: Episodes per generated item: the IC-SSL data modules' default chunk_size, which the configs keep.
CHUNK_SIZE = 16


def _configs(files: tuple[str, ...]) -> list[str]:
    """``--config`` once per file of ``configs/`` (a base, then its overlay: LightningCLI merges them in order)."""
    return [arg for f in files for arg in ("--config", str(CONFIGS / f))]


def _budget(steps: int, args: argparse.Namespace) -> list[str]:
    """The training budget of one run.

    Fixed length (no ``--patience``): ``steps`` steps in ``--epochs`` epochs, one validation round per epoch.
    At convergence (``--patience P``): a validation round every ``--val-every`` steps, and the shared
    early-stopping rule (``--early_stopping.patience P`` on the config's monitored validation metric) ends the run
    after P rounds without a rise of more than ``--min-delta``; ``steps`` is the cap (``--trainer.max_steps``), over which the cosine
    learning-rate schedule is laid out. ``--min-steps S`` (``--trainer.min_steps``, at most ``steps``) keeps a run
    going for S steps whatever the rule says. (For the linear-kernel E2E runs that stop at step 100 it changes
    little: their dip is a collapse at the peak learning rate, which ``configs/icssl/manifolds/lower_lr.yaml`` avoids.)
    """
    if args.patience is None:
        per_epoch = max(steps // args.epochs, 1)
        return ["--trainer.max_epochs", str(args.epochs), "--data.init_args.train_batches_per_epoch", str(per_epoch)]
    rounds = -(-steps // args.val_every)
    return ["--trainer.max_steps", str(steps), "--trainer.max_epochs", str(rounds),
            "--data.init_args.train_batches_per_epoch", str(args.val_every),
            "--early_stopping.patience", str(args.patience), "--early_stopping.min_delta", str(args.min_delta),
            *(["--trainer.min_steps", str(min(args.min_steps, steps))] if args.min_steps else [])]


def tested_checkpoint(fit_folder: Path, args: argparse.Namespace) -> Path:
    """The checkpoint a model is tested from: at convergence its best validation round (what early stopping
    selects; ``best-*.ckpt`` of the config's monitored checkpoint), otherwise its last step."""
    if args.patience is not None:
        best = best_checkpoint(fit_folder)
        if best is not None:
            return best
    return fit_folder / "checkpoints" / "last.ckpt"


def _model_section(config: tuple[str, ...], out: Path, write: bool) -> Path:
    """The ``model:`` part of a shipped config (a base and its overlay merged) as a file, for ``--model <file>``;
    written only when ``write`` (a stage that trains, not a dry run or a report: they only name it)."""
    import yaml

    def merge(a: dict, b: dict) -> dict:
        return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                        for k, v in b.items()}}

    model: dict = {}
    for f in config:
        model = merge(model, yaml.safe_load((CONFIGS / f).read_text()).get("model") or {})
    path = out / "_models" / ("_".join(Path(f).with_suffix("").as_posix().replace("/", "_") for f in config) + ".yaml")
    if not write:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(model, sort_keys=False))
    return path


def fit_model_section(fit_folder: Path, write: bool) -> Path:
    """The ``model:`` part of a finished fit's ``config.yaml`` as ``<fit folder>_model.yaml`` beside it, for
    testing that model with another config's data (``--model <file>``). Written once the fit's config exists, and
    only when ``write`` (a stage that runs the tests, not a dry run, a report or a refused command: they only name
    it)."""
    import yaml

    path = fit_folder.parent / f"{fit_folder.name}_model.yaml"
    config = fit_folder / "config.yaml"
    if write and config.is_file() and not path.is_file():
        path.write_text(yaml.safe_dump(yaml.safe_load(config.read_text())["model"], sort_keys=False))
    return path


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    """Every training run of the grid, most informative first (RBF, then Table 6, images, linear)."""
    out = args.out
    jobs: list[Job] = []

    def add(name: str, seed: int, argv: list[str]) -> None:
        folder = out / name / f"s{seed}"
        seeds = ["--seed_everything", str(seed), "--data.init_args.data_seed", str(seed)]
        jobs.append(Job(f"fit {name} s{seed}", ["fit", *argv, *seeds, *logger_args(out, name, f"s{seed}")], folder))

    overlays = overlay_argv(args.overlay)
    # The merged model sections are written for a stage that trains, once the runner has checked the grid and claimed
    # its folder (a refused command writes nothing).
    trains = args.stage in ("fit", "all") and not args.dry_run and getattr(args, "grid_claimed", False)
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
                        *_configs(config), *overlays, *extra, f"{HEAD}.kernel", kernel,
                        "--data.init_args.train_manifolds", str(train),
                        "--data.init_args.val_manifolds", str(train),
                        "--data.init_args.val_episodes", str(args.val_episodes),
                        *_budget(steps, args),
                    ])
        if kernel == "rbf":
            for seed in args.seeds:
                for name, config in PRODUCT_MODELS.items():
                    add(name, seed, [*_configs(config),
                                     "--data.init_args.val_episodes", str(args.val_episodes),
                                     *_budget(args.steps, args)])
                for model, (config, extra) in MODELS.items():
                    steps = args.eig_steps if model.startswith("eig") else args.steps
                    # The image data module with this model's net: the net comes from the manifold config.
                    add(f"{model}_rbf_images", seed, [
                        "--config", str(CONFIGS / IMAGE_MANIFOLDS),
                        "--model", str(_model_section(config, out, write=trains)), *extra,
                        *([f"{REP}.init_args.n_neighbors", "4"] if model.startswith("eig") else []),
                        "--data.init_args.root", str(args.image_root),
                        *_budget(steps, args),
                    ])
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    """The tests of every trained model: its synthetic test manifold(s), and the image manifolds for Table 5."""
    out = args.out
    jobs: list[Job] = []
    common = ["--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false"]
    # The fits' model sections are written for a stage that runs tests, once the runner has checked the grid and
    # claimed its folder, or by the SLURM job that submits the tests after the fits (`--from-stage test`).
    tests = args.stage in ("test", "all") and not args.dry_run and (
        getattr(args, "grid_claimed", False) or getattr(args, "from_stage", "fit") == "test")
    for fit in fit_jobs(args):
        name, seed = fit.folder.parent.name, fit.folder.name
        ckpt = ["--ckpt_path", str(tested_checkpoint(fit.folder, args))]

        def add(what: str, argv: list[str], fit: Job = fit, name: str = name, seed: str = seed,
                ckpt: list[str] = ckpt) -> None:
            folder = out / name / f"{seed}_test_{what}"
            argv = ["test", *argv, *ckpt, *common, *logger_args(out, name, folder.name)]
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
            # The image config's data with the fit's own model (EIG+ICL keeps its exact eigenmap).
            add("images", ["--config", str(CONFIGS / IMAGE_MANIFOLDS), "--model", str(fit_model_section(fit.folder, write=tests)),
                           "--data.init_args.root", str(args.image_root)])
    return jobs


#: A test run of the grid: ``<model>/s<seed>_test_<what>`` (``what``: manifolds, images or product).
TEST_RUN = re.compile(r"^(?P<name>[^/]+)/s(?P<seed>\d+)_test_(?P<what>[a-z]+)$")


def _by_seed(records: dict[str, RunRecord], name: str, what: str, seeds: list[int]) -> dict[tuple, dict[int, float]]:
    """``{(method kind, manifold, n_labeled): {seed: accuracy}}`` from the test runs of one model.

    ``method kind`` is ``model`` for the trained model and ``class_prior`` for the constant-class floor.
    """
    found: dict[tuple, dict[int, float]] = {}
    for seed in seeds:
        record = records.get(f"{name}/s{seed}_test_{what}")
        if record is None or record.results is None:
            continue
        for row in record.results["rows"]:
            if row["metric"] != "accuracy" or row["method"] == "labeled_majority":
                continue
            kind = "class_prior" if row["method"] == "class_prior" else "model"
            found.setdefault((kind, row.get("manifold"), row.get("n_labeled")), {})[seed] = row["value"]
    return found


def _accuracies(records: dict[str, RunRecord], name: str, what: str, seeds: list[int]) -> dict[tuple, list[float]]:
    """:func:`_by_seed` as ``{key: [accuracy per seed, in seed order]}``."""
    return {key: [v[s] for s in seeds if s in v] for key, v in _by_seed(records, name, what, seeds).items()}


def _stopping(records: dict[str, RunRecord], name: str, what: str, seeds: list[int]) -> list[dict]:
    """The early-stopping records (``meta.stopping``) of one model's test runs, one per seed that has one."""
    found = []
    for seed in seeds:
        record = records.get(f"{name}/s{seed}_test_{what}")
        if record is not None and record.results is not None:
            meta = record.results["meta"]
            if meta.get("stopping"):
                found.append({**meta["stopping"], "tested_step": meta.get("trained_steps")})
    return found


def verdict(ours: float, ours_sd: float, n_seeds: int, paper: float | None, spread: float) -> str:
    """Whether a margin (E2E minus EIG+ICL, in points) reproduces the paper's.

    *not resolved*: our margin is within one sd over seeds of zero, so its sign is not measured (whether the
    paper's value lies within its spread of ours is added); *reproduced*: a resolved margin of the same sign,
    within the paper's spread (``spread``, the sd of the paper's margin); *same sign, outside the paper's
    spread*; *opposite sign*. A paper margin within its own spread of zero has no sign to match: then ours
    either lies within that spread (*reproduced: no margin*) or outside it.
    """
    if paper is None:
        return "no paper value"
    if n_seeds < 2:
        return "one seed: no sd"
    within = abs(ours - paper) <= spread
    if abs(paper) <= spread:  # e.g. 0.970 vs 0.970: the paper measured no margin, so there is no sign to match
        return ("reproduced: no margin (the paper's is within its spread of zero, and ours within that spread)"
                if within else "the paper's margin is within its spread of zero; ours is outside that spread")
    if abs(ours) <= ours_sd:
        return "not resolved (|margin| <= sd over seeds)" + (", within the paper's spread" if within else "")
    if ours * paper > 0:
        return "reproduced" if within else "same sign, outside the paper's spread"
    return "opposite sign"


def _cell(values: list[float] | None, paper: list[float] | None = None, seeds: int = 3) -> str:
    if not values:
        text = "--"
    else:
        m, sd = mean_sd(values)
        text = f"{m:.3f} ± {sd:.3f}" + ("" if len(values) == seeds else f" (n={len(values)})")
    return text if paper is None else f"{text} ({paper[0]:.3f})"


@dataclass
class Margin:
    """E2E ICL minus EIG+ICL on one manifold: our accuracies per seed and the paper's (mean, sd) pairs."""

    config: str
    kernel: str
    ctx: int
    split: str
    manifold: str
    e2e: dict[int, float]
    eig: dict[int, float]
    paper_e2e: list[float] | None
    paper_eig: list[float] | None

    @property
    def paper(self) -> float | None:
        return None if not self.paper_e2e or not self.paper_eig else self.paper_e2e[0] - self.paper_eig[0]

    @property
    def paper_spread(self) -> float:
        """The sd of the paper's margin: its two sds combined as independent."""
        return 0.0 if self.paper is None else (self.paper_e2e[1] ** 2 + self.paper_eig[1] ** 2) ** 0.5


SPLITS = {"id": "ID", "id5": "ID, five", "ood": "OOD"}


def margin_tables(margins: list[Margin]) -> list[str]:
    """The E2E-minus-EIG margins, in points: mean over the manifolds (paired by seed) with its sd over seeds and
    a verdict against the paper, then each manifold's margin."""
    rows, verdicts = [], []
    for config, kernel, split in itertools.product(("tuned", "faithful"), ("linear", "rbf"), SPLITS):
        cells = []
        for ctx in (3, 21, 39):
            sel = [x for x in margins if (x.config, x.kernel, x.ctx, x.split) == (config, kernel, ctx, split)]
            common = sorted(set.intersection(*(set(x.e2e) & set(x.eig) for x in sel))) if sel else []
            if not common:
                cells.append("--")
                continue
            per_seed = [100 * sum(x.e2e[s] - x.eig[s] for x in sel) / len(sel) for s in common]
            ours, sd = mean_sd(per_seed)
            papers = [x.paper for x in sel if x.paper is not None]
            theirs = 100 * sum(papers) / len(papers) if len(papers) == len(sel) else None
            spread = 100 * sum(x.paper_spread for x in sel) / len(sel)
            cells.append(f"{ours:+.1f} ± {sd:.1f}" + (f" ({theirs:+.1f})" if theirs is not None else ""))
            if theirs is not None:
                verdicts.append([config, kernel, SPLITS[split], str(ctx), f"{len(sel)}", f"{len(common)}",
                                 f"{ours:+.1f} ± {sd:.1f}", f"{theirs:+.1f} ± {spread:.1f}",
                                 verdict(ours, sd, len(common), theirs, spread)])
        if any(c != "--" for c in cells):
            rows.append([config, kernel, SPLITS[split], *cells])
    parts = ["### E2E ICL minus EIG+ICL, accuracy points: mean over the manifolds with both, ± sd over seeds "
             "(paper)\n\n" + markdown_table(["config", "kernel", "split", "3 labels", "21 labels", "39 labels"], rows)]
    if verdicts:
        parts.append("### Margins against the paper (reproduced: same sign and within the paper's spread, the sd of "
                     "its margin)\n\n" + markdown_table(["config", "kernel", "split", "labels", "manifolds", "seeds", "ours",
                                                  "paper", "verdict"], verdicts))
    # Per manifold, ID and OOD: a mean over five manifolds can hide one manifold that carries the whole margin.
    rows = []
    for x in sorted(margins, key=lambda m: m.split != "id"):
        common = sorted(set(x.e2e) & set(x.eig))
        if x.split not in ("id", "ood") or not common:
            continue
        ours, sd = mean_sd([100 * (x.e2e[s] - x.eig[s]) for s in common])
        paper = "--" if x.paper is None else f"{100 * x.paper:+.1f} ± {100 * x.paper_spread:.1f}"
        rows.append([x.config, SPLITS[x.split], f"{x.kernel}-{x.manifold}", str(x.ctx), f"{ours:+.1f} ± {sd:.1f}",
                     paper, verdict(ours, sd, len(common), None if x.paper is None else 100 * x.paper,
                                    100 * x.paper_spread)])
    if rows:
        parts.append("### Margin per manifold (E2E ICL minus EIG+ICL, points, ± sd over seeds; paper ± its spread)"
                     "\n\n" + markdown_table(["config", "split", "kernel-target", "labels", "ours", "paper", "verdict"],
                                            rows))
    return parts


def steps_table(records: dict[str, RunRecord], seeds: list[int]) -> str:
    """How long each group of models trained, from the early-stopping records in their test results."""
    groups: dict[str, list[dict]] = {}
    for name in sorted({run.split("/")[0] for run in records if "/" in run and not run.startswith("_")}):
        what = "product" if name.startswith("product_") else ("images" if name.endswith("_images") else "manifolds")
        group = name.split("_only_")[0] + "_only" if "_only_" in name else (
            name.split("_no_")[0] + "_no" if "_no_" in name else name)
        groups.setdefault(group, []).extend(_stopping(records, name, what, seeds))
    return length_table(groups)


def length_table(groups: dict[str, list[dict]]) -> str:
    """Median and range of the best and the stopping step per group of runs, from their early-stopping records
    (``stopping.json`` / ``meta.stopping``: ``best_step``, ``stopped_step``, ``stopped_early``, ``patience``,
    ``max_steps``)."""
    rows = []
    for group, records in groups.items():
        if not records:
            continue
        best = sorted(r["best_step"] for r in records if r.get("best_step") is not None)
        stopped = sorted(r["stopped_step"] for r in records)
        capped = sum(not r["stopped_early"] for r in records)
        rows.append([group, str(len(records)), f"{statistics.median(best):g} ({best[0]}-{best[-1]})" if best else "--",
                     f"{statistics.median(stopped):g} ({stopped[0]}-{stopped[-1]})", f"{capped} of {len(records)}",
                     str(records[0]["patience"]), str(records[0]["max_steps"])])
    if not rows:
        return "(no run recorded an early stop: trained at fixed length)"
    return ("### Training length (early stopping on the config's monitored validation metric; tested at the best "
            "round)\n\n" + markdown_table(["models", "runs", "best step: median (range)", "stopped at: median (range)",
                                    "reached the cap", "patience (rounds)", "cap (steps)"], rows))


def report_header(args: argparse.Namespace, records: dict[str, RunRecord], seeds: list[int]) -> str:
    """How the reported runs trained and were tested, read from their test results and configs (not from this
    command's options, which a report from a CSV, or with other options than the grid's, does not share); then
    any option given to this report that disagrees with the runs, so that it cannot pass for what they did.

    Training length: at fixed length, the steps of the tested checkpoints (``meta.trained_steps``); at convergence,
    the early-stopping record of the tested checkpoint (``meta.stopping``: patience, ``min_delta``, the step cap)
    and the validation interval (``data.train_batches_per_epoch``, or the cap over the epochs). A value the runs
    did not record (a tidy CSV keeps only the config values that vary between runs) is left out."""
    tests = [(m["name"], record) for run, record in records.items()
             if (m := TEST_RUN.match(run)) and int(m["seed"]) in seeds and record.results is not None]
    if not tests:
        return "no finished test."
    e2e = [r for name, r in tests if not name.startswith("eig")]
    eig = [r for name, r in tests if name.startswith("eig")]

    def stops(group: list[RunRecord]) -> list[dict]:
        return [r.results["meta"]["stopping"] for r in group if r.results["meta"].get("stopping")]

    def steps(group: list[RunRecord]) -> str:  # the cap at convergence, else the steps trained
        caps = [s.get("max_steps") for s in stops(group)]
        return ran_values(caps or [r.results["meta"].get("trained_steps") for r in group])

    def val_every(record: RunRecord) -> int | None:
        stopping = record.results["meta"]["stopping"]
        per_epoch = record.config.get("data.train_batches_per_epoch")
        if per_epoch is None and stopping.get("max_steps") and stopping.get("max_epochs"):
            cap, epochs = stopping["max_steps"], stopping["max_epochs"]
            per_epoch = cap // epochs if cap % epochs == 0 else None
        return per_epoch

    stopped = [r for _, r in tests if r.results["meta"].get("stopping")]
    ran = {"steps": steps(e2e), "eig_steps": steps(eig),
           "patience": ran_values(s.get("patience") for s in stops(e2e + eig)),
           "min_delta": ran_values(s.get("min_delta") for s in stops(e2e + eig)),
           "val_every": ran_values(val_every(r) for r in stopped),
           "test_episodes": ran_values(r.config.get("data.test_episodes") for name, r in tests
                                       if not name.endswith("_images"))}
    if not stopped:
        length = f"E2E models trained {ran['steps']} steps" if ran["steps"] else ""
        if ran["eig_steps"]:
            length += f", EIG+ICL heads {ran['eig_steps']}" if length else f"EIG+ICL heads trained {ran['eig_steps']} steps"
    else:
        caps = [f"{ran['steps']} steps for E2E"] if ran["steps"] else []
        if ran["eig_steps"]:
            caps.append(f"{ran['eig_steps']}{'' if caps else ' steps'} for EIG+ICL heads")
        floor = ran_values(r.config.get("trainer.min_steps") for r in stopped)
        rounds = f"{ran['patience']} rounds" + (f" of {ran['val_every']} steps" if ran["val_every"] else "")
        length = (f"trained until the validation metric rose by no more than {ran['min_delta']} for {rounds} "
                  f"(cap {', '.join(caps)}" + (f"; at least {floor} steps" if floor else "") + "), tested at the best round")
        if len(stopped) < len(tests):
            length += " (some runs trained at fixed length, without early stopping)"
    episodes = (f"{ran['test_episodes']} test episodes per manifold" if ran["test_episodes"] else
                "test episodes per manifold not recorded")
    text = f"{length}; {episodes}."
    return text + unused_options_note(args, given_options(_parser(), args.argv), ran, bool(stopped))


def report(args: argparse.Namespace) -> str:
    """Tables 2-6 as Markdown: our mean ± sd over the seeds, the paper's mean in parentheses. Rows (and tables)
    of parts of the grid with no finished test are left out, so a partial grid reports only what it ran."""
    import json

    paper = json.loads((Path(__file__).with_name("icssl_paper_numbers.json")).read_text())
    records = grid_records(args)
    have = (int(m["seed"]) for run, record in records.items()
            if (m := TEST_RUN.match(run)) and record.results is not None)
    seeds, seeds_text = chosen_seeds(have, args.seeds, "seeds" in given_options(_parser(), args.argv))
    if not seeds:
        return refuse_empty_report(args, "tested runs" + (f" of seeds {args.seeds}" if "seeds" in given_options(
            _parser(), args.argv) else ""))
    n = len(seeds)
    parts = [f"Accuracy on the unlabeled points, mean ± sd over {seeds_text} (paper's mean in parentheses); "
             + report_header(args, records, seeds)]
    margins = []
    for config, eig in (("tuned", "eig"), ("faithful", "eig_faithful")):
        for ctx in (3, 21, 39):
            rows = []
            for kernel in ("linear", "rbf"):
                for m in MANIFOLDS:
                    ref = paper["tables_2_4"][f"{kernel}/{m}/{ctx}"]
                    cells, got, seeded, priors = [], {}, {}, []
                    # ID as the paper (trained on this manifold alone), ID on all five, OOD (the other four).
                    for col, model, train in (
                        ("eig_id", eig, f"only_{m}"), ("eig_id5", eig, "five"), ("eig_ood", eig, f"no_{m}"),
                        ("e2e_id", config, f"only_{m}"), ("e2e_id5", config, "five"), ("e2e_ood", config, f"no_{m}"),
                    ):
                        by_seed = _by_seed(records, f"{model}_{kernel}_{train}", "manifolds", seeds)
                        acc = {k: [v[s] for s in seeds if s in v] for k, v in by_seed.items()}
                        where = m if train == "five" else None
                        got[col] = acc.get(("model", where, ctx))
                        seeded[col] = by_seed.get(("model", where, ctx), {})
                        priors.append(acc.get(("class_prior", where, ctx)))
                        cells.append(_cell(got[col], ref.get(col), n))
                    # The floor of a constant class (any run's test set of this manifold; most seeds wins).
                    prior = max(priors, key=lambda v: len(v or []))
                    if any(got.values()):  # rows of a part of the grid that was not run are left out
                        rows.append([f"{kernel}-{m}", *cells, _cell(prior, None, n)])
                    for split in ("id", "id5", "ood"):
                        if got[f"e2e_{split}"] and got[f"eig_{split}"]:
                            paper_e2e, paper_eig = ref.get(f"e2e_{split}"), ref.get(f"eig_{split}")
                            margins.append(Margin(config, kernel, ctx, split, m, seeded[f"e2e_{split}"],
                                                  seeded[f"eig_{split}"], paper_e2e, paper_eig))
            if rows:
                parts.append(f"### Tables 2-4, {ctx} labeled points, {config} configuration\n\n" + markdown_table(
                    ["kernel-target", "EIG+ICL (ID)", "EIG+ICL (ID, five)", "EIG+ICL (OOD)", "E2E ICL (ID)",
                     "E2E ICL (ID, five)", "E2E ICL (OOD)", "class prior"], rows))
    if margins:
        parts.extend(margin_tables(margins))
    parts.append(steps_table(records, seeds))
    for config, eig in (("tuned", "eig"), ("faithful", "eig_faithful")):
        rows = []
        for ctx in (3, 21, 39):
            id_eig = _accuracies(records, f"{eig}_rbf_images", "images", seeds).get(("model", None, ctx))
            id_e2e = _accuracies(records, f"{config}_rbf_images", "images", seeds).get(("model", None, ctx))
            for m in MANIFOLDS:
                ref = paper["table_5"][f"{m}/{ctx}"]
                ood_eig = _accuracies(records, f"{eig}_rbf_no_{m}", "images", seeds).get(("model", None, ctx))
                ood_e2e = _accuracies(records, f"{config}_rbf_no_{m}", "images", seeds).get(("model", None, ctx))
                if not any((id_eig, ood_eig, id_e2e, ood_e2e)):
                    continue
                rows.append([str(ctx), ",".join(x for x in MANIFOLDS if x != m),
                             _cell(id_eig, ref["eig_id"], n), _cell(ood_eig, ref["eig_ood"], n),
                             _cell(id_e2e, ref["e2e_id"], n), _cell(ood_e2e, ref["e2e_ood"], n)])
        if rows:
            parts.append(f"### Table 5 (RBF, image manifolds: {args.image_root.name}), {config} configuration\n\n"
                         + markdown_table(["labels", "training manifolds (OOD)", "EIG+ICL (ID)", "EIG+ICL (OOD)",
                                           "E2E ICL (ID)", "E2E ICL (OOD)"], rows))
    rows = []
    for ctx in (3, 5, 10, 15, 20, 40, 80):
        ref = paper["table_6"][str(ctx)]
        got = [_accuracies(records, model, "product", seeds).get(("model", None, ctx)) for model in PRODUCT_MODELS]
        if any(got):
            rows.append([str(ctx), *(_cell(v, ref[model], n) for v, model in zip(got, PRODUCT_MODELS))])
    if rows:
        parts.append("### Table 6 (product manifold, 5 factors)\n\n" + markdown_table(
            ["labels", "Lap+PE (1 layer)", "our model", "Lap (linear)"],
            [[r[0], r[2], r[1], r[3]] for r in rows]))
    return "\n\n".join(parts)


def _parser() -> argparse.ArgumentParser:
    """The driver's options (:func:`parse_args` parses and checks them; a report asks which were given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arg(parser)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "icssl_tables")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=positive_int, default=300, help="training steps of each E2E model")
    parser.add_argument("--eig-steps", type=positive_int, default=None,
                        help="training steps of each EIG+ICL head (default: --steps, the same budget)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs (validation + checkpoint) per run")
    parser.add_argument("--val-episodes", type=int, default=128)
    parser.add_argument("--test-episodes", type=int, default=512)
    parser.add_argument("--image-root", type=Path, default=DEFAULT_IMAGE_ROOT)
    add_overlay_arg(parser, "each Tables 2-4 model's own config (E2E and EIG+ICL)",
                    "configs/icssl/manifolds/few_labels.yaml")
    add_job_args(parser)
    add_convergence_args(parser)
    add_report_args(parser)
    return parser


def check_episodes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``parser.error``: one line, exit 2, before anything is written) ``--val-episodes`` or
    ``--test-episodes`` that the synthetic manifolds' data module cannot make: else every job fails alike, each
    after writing its folder."""
    for name, episodes in (("--val-episodes", args.val_episodes), ("--test-episodes", args.test_episodes)):
        if episodes < 1 or episodes % CHUNK_SIZE:
            parser.error(f"{name} {episodes}: the episodes come in chunks of {CHUNK_SIZE} (the configs' chunk_size); "
                         f"give a positive multiple of {CHUNK_SIZE} (e.g. {max(CHUNK_SIZE, episodes - episodes % CHUNK_SIZE)})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _parser()
    args = parse_driver_args(parser, argv, __file__)
    args.out = args.out.resolve()
    check_out(parser, args)
    if args.eig_steps is None:
        # The unnormalised Eq. 6 head needs more than 100 steps to leave the constant answer it starts in.
        args.eig_steps = args.steps
    check_episodes(parser, args)
    if args.stage != "report" and args.image_root.resolve() != DEFAULT_IMAGE_ROOT and not args.image_root.is_dir():
        parser.error(f"--image-root {args.image_root}: no such folder; point it at the image-manifold sequences "
                     f"(one folder of frames per sequence), or drop it to use the stand-in, built on first use at "
                     f"{DEFAULT_IMAGE_ROOT.relative_to(REPO)}")
    check_convergence_args(parser, args)
    if args.patience is None:  # fixed-length runs train --epochs epochs of steps / epochs batches each
        for name, steps in (("--steps", args.steps), ("--eig-steps", args.eig_steps)):
            if steps % args.epochs:
                parser.error(f"{name} {steps} is not a multiple of --epochs {args.epochs}: each epoch trains "
                             f"{name} / --epochs batches; give a multiple (e.g. {steps - steps % args.epochs or args.epochs})")
    return args


def check_finished_tests(args: argparse.Namespace, jobs: list[Job]) -> None:
    """Refuse a ``test`` (or ``all``) whose test settings differ from those of tests it would skip as done.

    A finished test is never rerun (its ``done`` marker), so ``test --test-episodes 128`` over tests run with 64
    would report "0 to run", record 128 in ``grid.json`` and leave 64-episode numbers behind. Each test's
    ``--data.init_args.<key> <value>`` is compared with the ``data.<key>`` its finished run saved in its
    ``config.yaml``; the first difference is refused in one line (exit 2, nothing written) naming both values and
    the ways out: the finished tests' value, or their folders removed to test them again."""
    import yaml
    from tidy import flatten

    for job in jobs:
        saved = job.folder / "config.yaml"
        if not job.done or not saved.is_file():
            continue
        config = flatten(yaml.safe_load(saved.read_text()))
        for flag, value in zip(job.argv, job.argv[1:]):
            key = flag.removeprefix("--").replace("init_args.", "")
            if not flag.startswith("--data.init_args.") or key not in config:
                continue
            wanted = yaml.safe_load(value)
            if str(wanted) != str(config[key]):
                option = {"data.test_episodes": "--test-episodes", "data.root": "--image-root"}.get(key, flag)
                print(f"{Path(args.script).name}: error: {option} {value}: the finished test "
                      f"{job.folder.relative_to(args.out)} ran with {config[key]} ({flag}), and a finished test is "
                      f"not run again; give {option} {config[key]} to test the rest of the grid alike, or remove the "
                      "finished test folders (or use another --out) to test with the new value", file=sys.stderr,
                      flush=True)
                sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.stage in ("test", "all"):
        check_finished_tests(args, select(test_jobs(args), args.only))
    drive(args, fit_jobs, test_jobs, report, parse_args)


if __name__ == "__main__":
    main()

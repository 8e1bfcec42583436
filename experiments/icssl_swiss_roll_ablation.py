"""Why ORIG+E2E-ICL trails EIG+ICL on the Swiss roll: one change at a time, trained and tested on the spiral alone.

    python experiments/icssl_swiss_roll_ablation.py fit --seeds 0 --jobs 2     # converged runs (shared rule)
    python experiments/icssl_swiss_roll_ablation.py test --jobs 2
    python experiments/icssl_swiss_roll_ablation.py report

Tables 2-4's ID cell for the Swiss roll compares two models that differ in how the graph is built and in how
much of its spectrum they keep. EIG+ICL embeds each episode with the bottom eigenvectors of a *kNN* RBF graph
(k = 6, App. D): sparse, and blind to the scale of the episode (App. D rescales each episode by 0.02-0.1). The
E2E model's Laplacian comes from dense RBF attention (every pair of points is connected, with a weight set by
learned bandwidths ``sigma_h``), and its eigenmap is an iterative, learned approximation. The variants separate
the candidate causes:

* graph: EIG+ICL on a *dense* RBF graph (``n_neighbors = n - 1``) at fixed scales that span the E2E model's
  initial bandwidths (``rbf_scale = 1 / sigma^2``), against the kNN graph;
* eigenvectors kept: EIG+ICL and E2E with 2 and 8 eigenvectors instead of 4;
* capacity: E2E with twice the Laplacian and eigenmap layers (``lap_layers = eig_layers = 4``);
* bandwidth: E2E starting from bandwidths 4x narrower;
* objective: E2E trained on 3 % labels only and selected (checkpoint and stopping rule) by validation accuracy at
  3 % labels (``configs/icssl/manifolds/few_labels.yaml``) instead of 3-39 % labels selected at 25 %.

Every variant is trained with the shared early-stopping rule (as ``icssl_paper_tables.py --patience``) on
``configs/icssl/manifolds.yaml`` with the RBF head, and tested at 3, 21 and 39 labels. ``report`` prints the
accuracies (mean ± sd over seeds) beside the two reference models of the converged Tables 2-4 run
(``--tables-out``), which this script does not re-train.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from icssl_paper_tables import (
    CONFIGS,
    EIG,
    HEAD,
    REP,
    TABLE_RATIOS,
    _accuracies,
    _budget,
    check_episodes,
    check_finished_tests,
    tested_checkpoint,
)
from runner import (
    REPO,
    Job,
    add_convergence_args,
    add_job_args,
    add_stage_arg,
    check_convergence_args,
    chosen_seeds,
    drive,
    given_options,
    logger_args,
    markdown_table,
    mean_sd,
    parse_driver_args,
    positive_int,
    refuse_empty_report,
    select,
)
from tidy import add_report_args, check_out, grid_records, load

RI = f"{REP}.init_args"
#: variant -> (what it tests, extra fit arguments on top of configs/icssl/manifolds.yaml on the spiral).
VARIANTS: dict[str, tuple[str, list[str]]] = {
    **{f"eig_dense_scale{s}": (f"graph: EIG+ICL on the dense RBF graph, rbf_scale {s} (sigma {s ** -0.5:.3g})",
                               [REP, EIG, f"{RI}.n_neighbors", "99", f"{RI}.rbf_scale", str(s)])
       for s in (300, 1600, 10000, 60000)},
    "eig_components2": ("eigenvectors: EIG+ICL with 2", [REP, EIG, f"{RI}.n_components", "2"]),
    "eig_components8": ("eigenvectors: EIG+ICL with 8", [REP, EIG, f"{RI}.n_components", "8"]),
    "e2e_components8": ("eigenvectors: E2E with 8", [f"{RI}.n_components", "8"]),
    "e2e_deeper": ("capacity: E2E with 4 + 4 layers", [f"{RI}.lap_layers", "4", f"{RI}.eig_layers", "4"]),
    "e2e_narrow": ("bandwidth: E2E from bandwidths 4x narrower",
                   [f"{RI}.lap_bandwidths", "[0.001, 0.0025, 0.00625, 0.015]"]),
    "e2e_few_labels": ("objective: E2E trained and selected at 3 labels",
                       ["--config", str(CONFIGS / "icssl" / "manifolds" / "few_labels.yaml")]),
}
#: The two models of the Tables 2-4 run this ablation starts from (trained there on the spiral alone).
REFERENCES = {"eig_rbf_only_spiral": "EIG+ICL (kNN graph, k = 6, 4 eigenvectors)",
              "tuned_rbf_only_spiral": "ORIG+E2E-ICL (tuned configuration)"}


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    jobs = []
    for seed in args.seeds:
        for name, (_, extra) in VARIANTS.items():
            steps = args.eig_steps if name.startswith("eig") else args.steps
            argv = ["fit", "--config", str(CONFIGS / "icssl" / "manifolds.yaml"), *extra, f"{HEAD}.kernel", "rbf",
                    "--data.init_args.train_manifolds", "[spiral]", "--data.init_args.val_manifolds", "[spiral]",
                    "--data.init_args.val_episodes", str(args.val_episodes), *_budget(steps, args),
                    "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
                    *logger_args(args.out, name, f"s{seed}")]
            jobs.append(Job(f"fit {name} s{seed}", argv, args.out / name / f"s{seed}"))
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    jobs = []
    for fit in fit_jobs(args):
        name, seed = fit.folder.parent.name, fit.folder.name
        folder = fit.folder.parent / f"{seed}_test_manifolds"
        argv = ["test", "--config", str(fit.folder / "config.yaml"), "--ckpt_path", str(tested_checkpoint(fit.folder, args)),
                "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false",
                "--data.init_args.test_manifolds", "[spiral]", "--data.init_args.test_episodes", str(args.test_episodes),
                "--data.init_args.eval_label_ratios", TABLE_RATIOS, *logger_args(args.out, name, folder.name)]
        jobs.append(Job(f"test {name} {seed}", argv, folder, after=[fit.folder]))
    return jobs


#: A test run of the ablation: ``<variant>/s<seed>_test_manifolds``.
TEST_RUN = re.compile(rf"^(?:{'|'.join(map(re.escape, VARIANTS))})/s(?P<seed>\d+)_test_manifolds$")


def report(args: argparse.Namespace) -> str:
    """The variants' accuracies beside the two reference models, over the seeds the variants were tested with (all
    of them without ``--seeds``, :func:`runner.chosen_seeds`: not the option's default, seed 0 alone)."""
    rows = []
    ours, tables = grid_records(args), load(args.tables_out)
    if not any(record.results is not None for record in ours.values()):
        return refuse_empty_report(args)
    have = [int(m["seed"]) for run, record in ours.items() if (m := TEST_RUN.match(run)) and record.results is not None]
    seeds, seeds_text = chosen_seeds(have, args.seeds, "seeds" in given_options(_parser(), args.argv))
    sources = [(tables, name, what) for name, what in REFERENCES.items()]
    sources += [(ours, name, what) for name, (what, _) in VARIANTS.items()]
    for records, name, what in sources:
        acc = _accuracies(records, name, "manifolds", seeds)
        cells = []
        for ctx in (3, 21, 39):
            values = acc.get(("model", None, ctx))
            cells.append("--" if not values else "{:.3f} ± {:.3f}".format(*mean_sd(values))
                         + ("" if len(values) == len(seeds) else f" (n={len(values)})"))
        rows.append([name, what, *cells])
    return (f"Swiss roll (spiral) ID accuracy, mean ± sd over {seeds_text}, converged runs\n\n"
            + markdown_table(["model", "change", "3 labels", "21 labels", "39 labels"], rows))


def _parser() -> argparse.ArgumentParser:
    """The driver's options (:func:`parse_args` parses and checks them; a report asks which were given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arg(parser)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "icssl_swiss_roll")
    parser.add_argument("--tables-out", type=Path, default=REPO / "runs" / "icssl_converged",
                        help="the converged Tables 2-4 run holding the two reference models (its run folder or "
                             "its tidy CSV)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=positive_int, default=4000, help="step cap of an E2E model")
    parser.add_argument("--eig-steps", type=positive_int, default=2000, help="step cap of an EIG+ICL head")
    add_convergence_args(parser, patience=5)
    parser.add_argument("--val-episodes", type=int, default=256)
    parser.add_argument("--test-episodes", type=int, default=512)
    add_job_args(parser)
    add_report_args(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _parser()
    args = parse_driver_args(parser, argv, __file__)
    args.out, args.tables_out = args.out.resolve(), args.tables_out.resolve()
    check_out(parser, args)
    check_episodes(parser, args)
    check_convergence_args(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.stage in ("test", "all"):  # a finished test is skipped: refuse other test settings than it ran with
        check_finished_tests(args, select(test_jobs(args), args.only))
    drive(args, fit_jobs, test_jobs, report, parse_args)


if __name__ == "__main__":
    main()

"""Run IC-SSL's dataset-size sweep on image features (Sec. 4.2: Fig. 3 and Table 1), resumably, and report it.

    python experiments/icssl_fig3_sweep.py fit --sizes 100 300 1000 3000 --seeds 0 --jobs 2   # train
    python experiments/icssl_fig3_sweep.py test --jobs 2                                     # test
    python experiments/icssl_fig3_sweep.py report                                            # Fig. 3 + Table 1

"Dataset size" is the number of distinct training episodes (``FeatureEpisodeDataModule.train_episodes``); every
size gets the same number of optimiser steps, so small sizes see each episode many times (Sec. 4.2). Per seed
and size, three methods are trained on ``configs/icssl/features.yaml``'s episodes (2 classes x 50 images):

* ``e2e``: ORIG+E2E-ICL, the config's model (learned Laplacian eigenmap + GD head);
* ``transformer``: the scale-matched Transformer baseline (App. G), the MetaICL-style ``unknown`` label token,
  with ``input_norm`` (each point scaled to unit RMS before its input projection);
* ``orig``: ORIG+ICL, the GD head on the raw features (only its head trains).

Each trained model is tested with separation rows (``RepresentationMetrics(rows=true)``); at the largest size
the E2E model is also tested with the Transformer's checkpoint loaded beside it
(``compare_checkpoints``), which gives Table 1's mNN / cycle-kNN / LCS alignment between our model, the
Transformer and EIG on the same episodes. ``report`` pools the tests with ``experiments/icssl_sweep.py``
(``sweep.png`` and ``results.json`` in ``<out>/sweep``: accuracy and separation vs dataset size, mean ± sd over
seeds, each method's steepest rise) and prints Table 1.

Jobs, resumption and logs work as in ``experiments/icssl_paper_tables.py``; both use the runner in ``experiments/runner.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner and the sweep beside this file
from icssl_paper_tables import (
    CONFIGS,
    _budget,
    check_finished_tests,
    length_table,
    tested_checkpoint,
)
from icssl_sweep import pool, sweep_report
from runner import (
    REPO,
    Job,
    add_convergence_args,
    add_job_args,
    add_overlay_arg,
    add_stage_arg,
    check_convergence_args,
    drive,
    logger_args,
    markdown_table,
    mean_sd,
    overlay_argv,
    parse_driver_args,
    positive_int,
    ran_values,
    refuse_empty_report,
    select,
    tested_cells,
)
from tidy import RunRecord, add_report_args, check_out, grid_records

CONFIG = CONFIGS / "icssl" / "features.yaml"
NET = "--model.init_args.net"

#: method -> extra fit arguments on top of the config (the feature dimension is filled in from the data file).
METHODS: dict[str, list[str]] = {
    "e2e": [],
    # The learning rate of configs/icssl/manifolds/transformer.yaml, the baseline's own overlay.
    # ``input_norm``: unit-RMS points into its projection. At the config's feature scale 0.1 (set for the
    # eigenmap's RBF bandwidths) the projected points are ~1e-3 of the label embedding and, in our runs, the loss
    # stayed at ln 2 for 1,500 steps. Normalising inside the net (not via the data's feature_scale) keeps the
    # episodes identical for every method, which Table 1's shared test batches need.
    "transformer": [NET, "lit_icl.icssl.ICLTransformerBaseline", "--model.init_args.lr", "0.0003",
                    f"{NET}.init_args.input_norm", "true"],
    "orig": [f"{NET}.init_args.representation", "lit_icl.icssl.RawCoordinates"],
}
#: The representation-metrics callback with result rows, for every test (Fig. 3's separation panel).
CALLBACK = {"class_path": "lit_icl.callbacks.RepresentationMetrics", "init_args": {"k": 10, "rows": True}}


def feature_dim(path: Path) -> int:
    """The feature dimension of a cached feature file (the Transformer's ``input_dim``)."""
    if not path.is_file():
        raise SystemExit(f"--features {path}: no feature file; build the offline stand-in with `python -m "
                         "lit_icl.icssl.build features-standin --out data/features_standin.pt` or pass --features")
    import torch  # after the check: a missing file is refused without loading torch
    return int(torch.load(path, map_location="cpu", weights_only=False)["features"].shape[1])


def _name(method: str, size: int) -> str:
    return f"{method}_size{size}"


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    """One training run per (seed, dataset size, method), the largest sizes last."""
    jobs = []
    overlays = overlay_argv(args.overlay)
    for size in args.sizes:
        for seed in args.seeds:
            for method, extra in METHODS.items():
                if method == "transformer":
                    extra = [*extra, f"{NET}.init_args.input_dim", str(args.input_dim)]
                name = _name(method, size)
                argv = ["fit", "--config", str(CONFIG), *overlays, *extra,
                        "--data.init_args.features", str(args.features),
                        "--data.init_args.train_episodes", str(size),
                        "--data.init_args.val_episodes", str(args.val_episodes),
                        "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
                        *_budget(args.steps, args), *logger_args(args.out, name, f"s{seed}")]
                jobs.append(Job(f"fit {name} s{seed}", argv, args.out / name / f"s{seed}"))
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    """Each model's test with separation rows, plus Table 1's alignment test at the largest size."""
    jobs = []
    common = ["--trainer.enable_progress_bar", "false",
              "--data.init_args.test_episodes", str(args.test_episodes)]
    for fit in fit_jobs(args):
        name, seed = fit.folder.parent.name, fit.folder.name
        argv = ["test", "--config", str(fit.folder / "config.yaml"), *common,
                "--trainer.callbacks", json.dumps([CALLBACK]),
                "--ckpt_path", str(tested_checkpoint(fit.folder, args))]
        folder = fit.folder.parent / f"{seed}_test"
        jobs.append(Job(f"test {name} {seed}", [*argv, *logger_args(args.out, name, folder.name)], folder,
                        after=[fit.folder]))
        if name == _name("e2e", max(args.sizes)):  # Table 1: our model, the Transformer and EIG, aligned
            other = args.out / _name("transformer", max(args.sizes)) / seed
            table1 = {**CALLBACK, "init_args": {
                **CALLBACK["init_args"],
                "compare_checkpoints": {"transformer": str(tested_checkpoint(other, args))}}}
            argv[argv.index("--trainer.callbacks") + 1] = json.dumps([table1])
            folder = fit.folder.parent / f"{seed}_test_table1"
            jobs.append(Job(f"test {name} {seed} with the transformer (Table 1)",
                            [*argv, *logger_args(args.out, name, folder.name)], folder, after=[fit.folder, other]))
    return jobs


def table1(args: argparse.Namespace, records: dict[str, RunRecord]) -> str:
    """Table 1: alignment between our model, the Transformer baseline and EIG (mean ± sd over seeds)."""
    found: dict[tuple[str, str], list[float]] = {}
    for seed in args.seeds:
        record = records.get(f"{_name('e2e', max(args.sizes))}/s{seed}_test_table1")
        if record is not None and record.results is not None:
            for row in record.results["rows"]:
                if row["metric"] in ("mnn", "cycle_knn", "lcs_knn") and "~" in str(row.get("embeddings")):
                    found.setdefault((row["embeddings"], row["metric"]), []).append(row["value"])
    if not found:
        return "(no Table 1 test has finished)"
    pairs = sorted({p for p, _ in found})
    rows = []
    for pair in pairs:
        cells = []
        for metric in ("mnn", "cycle_knn", "lcs_knn"):
            values = found.get((pair, metric))
            cells.append("--" if not values else "{:.3f} ± {:.3f}".format(*mean_sd(values)))
        rows.append([pair, *cells])
    # The episodes the tests ran on (their configs), not this report's --test-episodes.
    episodes = ran_values(records[f"{_name('e2e', max(args.sizes))}/s{seed}_test_table1"].config.get(
        "data.test_episodes") for seed in args.seeds if f"{_name('e2e', max(args.sizes))}/s{seed}_test_table1" in records)
    return (f"Table 1 (dataset size {max(args.sizes)}, {episodes or args.test_episodes} test episodes, k = 10)\n\n"
            + markdown_table(["embeddings", "mNN", "cycle-kNN", "LCS"], rows))


def _runs(args: argparse.Namespace, suffix: str = "") -> list[str]:
    """The grid's run names (``<method>_size<n>/s<seed><suffix>``) in the order the jobs run."""
    return [f"{_name(method, size)}/s{seed}{suffix}" for size in args.sizes for seed in args.seeds for method in METHODS]


#: A test run of the sweep: ``<method>_size<n>/s<seed>_test``.
TEST_RUN = re.compile(rf"^(?:{'|'.join(METHODS)})_size(?P<size>\d+)/s(?P<seed>\d+)_test$")


def report(args: argparse.Namespace) -> int | str:
    records = grid_records(args)
    # Without --sizes/--seeds: every size and seed with a finished test, as the tables' report reads every seed.
    args = tested_cells(args, _parser(), records, TEST_RUN)
    tests = [(run, records[run].results) for run in _runs(args, "_test")
             if run in records and records[run].results is not None]
    if not tests:
        return refuse_empty_report(args)
    out = args.sweep_out or (None if args.out.suffix == ".csv" else args.out / "sweep")
    text = sweep_report(pool(tests), args.label_ratio, out, [run for run, _ in tests])
    if text is None:
        print(f"no accuracy rows at label ratio {args.label_ratio} in the tests", file=sys.stderr)
        return 2
    print(text)
    print("\n" + table1(args, records))
    print("\n" + training_length(args, records))
    return 0


def training_length(args: argparse.Namespace, records: dict[str, RunRecord]) -> str:
    """How long each method trained at each size, from the fits' ``stopping.json`` (``--patience`` runs only)."""
    groups: dict[str, list[dict]] = {}
    for run in _runs(args):
        if run in records and records[run].stopping is not None:
            groups.setdefault(run.split("/")[0], []).append(records[run].stopping)
    return length_table(groups)


def _parser() -> argparse.ArgumentParser:
    """The driver's options (:func:`parse_args` parses and checks them; a report asks which were given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arg(parser)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "icssl_fig3")
    parser.add_argument("--features", type=Path, default=REPO / "data" / "features_standin.pt")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000, 3000],
                        help="dataset sizes (training episodes); the paper sweeps up to 5000")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=positive_int, default=300, help="training steps of every run")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs (validation + checkpoint) per run")
    parser.add_argument("--val-episodes", type=int, default=64)
    parser.add_argument("--test-episodes", type=int, default=256)
    parser.add_argument("--label-ratio", type=float, default=0.03, help="the accuracy curve's label ratio")
    add_overlay_arg(parser, "configs/icssl/features.yaml",
                    "configs/icssl/features/few_labels.yaml (train at 3 %% labels, as Sec. 4.2)")
    parser.add_argument("--sweep-out", type=Path, default=None,
                        help="report: the folder for sweep.png and the sweep's results.json (default: <out>/sweep; "
                             "none when --out is a tidy CSV)")
    add_job_args(parser)
    add_convergence_args(parser)
    add_report_args(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _parser()
    args = parse_driver_args(parser, argv, __file__)
    args.out, args.features = args.out.resolve(), args.features.resolve()
    check_out(parser, args)
    if min(args.sizes) < 1:
        parser.error(f"--sizes {args.sizes}: every dataset size must be at least 1 episode")
    check_convergence_args(parser, args)
    args.input_dim = None
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.stage != "report":  # the report reads finished runs, not the feature file
        try:
            args.input_dim = feature_dim(args.features)
        except SystemExit as missing:  # the drivers' refusal: one line with the script's name, exit 2
            print(f"{Path(args.script).name}: error: {missing}", file=sys.stderr, flush=True)
            sys.exit(2)
    if args.stage in ("test", "all"):
        check_finished_tests(args, select(test_jobs(args), args.only))

    def parse_grid(grid_argv: list[str]) -> argparse.Namespace:
        """The grid's recorded command, parsed, with the feature dimension this command read: ``input_dim`` is not
        an option but a value read from ``--features`` (which the comparison of settings covers), so the grid's
        record, parsed without reading the file, would otherwise differ from every rerun in it and each ``fit`` or
        ``all`` into the grid would be refused as a change of settings."""
        ran = parse_args(grid_argv)
        ran.input_dim = args.input_dim
        return ran

    drive(args, fit_jobs, test_jobs, report, parse_grid)


if __name__ == "__main__":
    main()

"""Run the multi-modal paper's Table 1 (avMNIST, five models) over seeds, resumably, and report its ordering.

    python experiments/mmca_avmnist_table1.py fit  --seeds 0 1 2 --noise-std 1.0 --patience 10 --jobs 2
    python experiments/mmca_avmnist_table1.py test --jobs 2
    python experiments/mmca_avmnist_table1.py report > table1.md

The five models are ``configs/mmca/avmnist.yaml`` and its overlays (Sec. 7, App. I): the full model (covariate
re-injection and cross-attention), no injection, no cross-attention, neither, and the standard bi-directional
cross-attention transformer. Every (model, seed) is one ``python -m lit_icl fit`` run with
``seed_everything = data_seed = seed``; jobs, logs and resumption work as in ``experiments/runner.py``.

Training length: the paper trains 100 epochs and reports each model's best test accuracy. With ``--patience P``
a run instead stops when ``val/acc`` (the validation split, not the test split) has not risen for P epochs, with
``--max-epochs`` as the cap (the shared early-stopping rule, ``--early_stopping.*``). ``--min-epochs M`` keeps
every run going for at least M epochs (``trainer.min_epochs``): at noise sd 1.0 a model can sit at chance for
60 epochs before it learns, and patience alone would end it on that plateau. Each model is then tested
twice: from the checkpoint of its best validation epoch (the early-stopping reading: test accuracy of the model
validation picks) and from its last checkpoint, whose per-epoch test history gives the paper's reading (best
test accuracy over epochs, over all epochs trained and over the paper's first 100) and the epoch at which the
model left the chance plateau. The report compares the full model with each other model in all three readings,
paired by seed, and ranks the models in each beside Table 1's ranking.

``--overlay FILE...`` stacks config files after each model's own (e.g. ``trainer: {accelerator: gpu}`` to train
on a GPU); a test run reads the config its fit saved, so it inherits them.
"""

from __future__ import annotations

import argparse
import re
import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from runner import (
    REPO,
    Job,
    add_job_args,
    add_overlay_arg,
    add_stage_arg,
    best_checkpoint,
    check_early_stopping_args,
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
    unused_options_note,
)
from tidy import RunRecord, add_report_args, check_out, grid_records

CONFIG = REPO / "configs" / "mmca" / "avmnist.yaml"
#: model -> (overlay under configs/mmca/avmnist/ or None, the paper's best test accuracy in %, Table 1).
MODELS: dict[str, tuple[str | None, float]] = {
    "full": (None, 63.85),
    "no_injection": ("no_injection", 62.72),
    "no_cross_attention": ("no_cross_attention", 62.10),
    "no_injection_no_cross_attention": ("no_injection_no_cross_attention", 60.79),
    "bi_cross_attention": ("bi_cross_attention", 62.72),
}
#: The offline stand-in's folder (lit_icl.mmca.avmnist.data.STANDIN_ROOT, not imported: the driver parses without
#: torch), relative to the repository, where runs start; a run builds it there when it is missing.
STANDIN_ROOT = "data/avmnist_lite"
#: The accuracy (%) above which a model has left the 10-class chance plateau (10 %).
LEFT_CHANCE = 20.0
#: The paper's training length (App. I): runs trained longer are also read at this length.
PAPER_EPOCHS = 100
#: The three readings of a run: test accuracy of the epoch validation picks, the paper's best test accuracy over
#: all epochs trained, and the paper's best test accuracy over its own 100 epochs.
READINGS = {"at_best_val": "test acc. at best val epoch", "best_test": "best test acc.",
            "best_test_paper": f"best test acc. in epochs 1-{PAPER_EPOCHS}"}


def _overlay(model: str) -> list[str]:
    overlay = MODELS[model][0]
    return [] if overlay is None else ["--config", str(CONFIG.parent / "avmnist" / f"{overlay}.yaml")]


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    """One training run per (seed, model), seed by seed."""
    jobs = []
    for seed in args.seeds:
        for model in MODELS:
            # The user's overlays (e.g. a GPU trainer) come after the model's, so they win on shared keys.
            argv = ["fit", "--config", str(CONFIG), *_overlay(model), *overlay_argv(args.overlay),
                    "--data.init_args.noise_std", str(args.noise_std),
                    "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
                    "--trainer.max_epochs", str(args.max_epochs), "--trainer.enable_progress_bar", "false",
                    *logger_args(args.out, model, f"s{seed}")]
            if args.root is not None:
                argv += ["--data.init_args.root", str(args.root)]
            if args.min_epochs is not None:
                argv += ["--trainer.min_epochs", str(args.min_epochs)]
            if args.patience is not None:
                if args.wait_for_score is not None:
                    argv += ["--early_stopping.wait_for_score", str(args.wait_for_score)]
                argv += ["--early_stopping.patience", str(args.patience),
                         "--early_stopping.min_delta", str(args.min_delta),
                         "--early_stopping.monitor", "val/acc", "--early_stopping.mode", "max",
                         # The checkpoint of the best validation epoch, for the early-stopping reading.
                         "--trainer.callbacks+=lit_icl.callbacks.RunCheckpoint",
                         "--trainer.callbacks.monitor=val/acc", "--trainer.callbacks.mode=max",
                         "--trainer.callbacks.filename=best-{epoch}-{step}"]
            jobs.append(Job(f"fit {model} s{seed}", argv, args.out / model / f"s{seed}"))
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    """Each model tested from its last checkpoint (the test history) and, with early stopping, its best one."""
    jobs = []
    for fit in fit_jobs(args):
        model, seed = fit.folder.parent.name, fit.folder.name
        ckpts = {"last": fit.folder / "checkpoints" / "last.ckpt"}
        best = best_checkpoint(fit.folder)
        if args.patience is not None and best is not None:
            ckpts["best"] = best
        for which, ckpt in ckpts.items():
            folder = fit.folder.parent / f"{seed}_test_{which}"
            # The overlays again, after the run's saved config: that config records the trainer of the fit's last
            # sitting, so a run trained on a GPU is tested on a CPU with an overlay that names the CPU.
            argv = ["test", "--config", str(fit.folder / "config.yaml"), *overlay_argv(args.overlay),
                    "--ckpt_path", str(ckpt), "--trainer.enable_progress_bar", "false",
                    *logger_args(args.out, model, folder.name)]
            jobs.append(Job(f"test {model} {seed} from {which}", argv, folder, after=[fit.folder]))
    return jobs


def _read(records: dict[str, RunRecord], run: str) -> dict | None:
    """``{"accuracy", "history", "stopping"}`` of one test run (accuracies in %), or ``None`` if it is missing."""
    record = records.get(run)
    if record is None or record.results is None:
        return None
    rows = record.results["rows"]
    history = [100 * r["value"] for r in sorted((r for r in rows if r["metric"] == "test_accuracy"),
                                                key=lambda r: r["epoch"])]
    acc = next(100 * r["value"] for r in rows if r["metric"] == "accuracy")
    return {"accuracy": acc, "history": history, "stopping": record.results["meta"].get("stopping"),
            "params": next((r["value"] for r in rows if r["metric"] == "params"), None)}


def _measured(args: argparse.Namespace) -> tuple[dict[str, dict[int, dict]], list[int], str, dict[str, RunRecord]]:
    """The measurements ``{model: {seed: {...}}}`` (best test accuracy over epochs, test accuracy at the best
    validation epoch, epochs trained, the epoch that left chance, parameters), the seeds they cover and how the
    header names them, and the grid's records.

    The seeds are those with a finished test (every seed of a CSV, whatever ``--seeds`` defaults to), or, with
    ``--seeds``, those of them that have one (:func:`runner.chosen_seeds`)."""
    records = grid_records(args)
    have = (int(m["seed"]) for run, record in records.items()
            if (m := re.match(r"^[^/]+/s(?P<seed>\d+)_test_last$", run)) and record.results is not None)
    seeds, seeds_text = chosen_seeds(have, args.seeds, "seeds" in given_options(_parser(), args.argv))
    found: dict[str, dict[int, dict]] = {}
    for model in MODELS:
        for seed in seeds:
            last = _read(records, f"{model}/s{seed}_test_last")
            if last is None or not last["history"]:
                continue
            history = last["history"]
            best = _read(records, f"{model}/s{seed}_test_best")
            found.setdefault(model, {})[seed] = {
                "best_test": max(history),
                "best_epoch": history.index(max(history)) + 1,
                "best_test_paper": max(history[:PAPER_EPOCHS]),
                "at_best_val": None if best is None else best["accuracy"],
                "epochs": len(history),
                "left_chance": next((e for e, a in enumerate(history, start=1) if a >= LEFT_CHANCE), None),
                "params": last["params"],
                "stopped_early": bool(last["stopping"] and last["stopping"]["stopped_early"]),
            }
    return found, seeds, seeds_text, records


def report_header(args: argparse.Namespace, records: dict[str, RunRecord], found: dict[str, dict[int, dict]],
                  seeds_text: str) -> str:
    """What the reported runs did, read from their tests (not from this command's options, which a report from a
    CSV, or with other options than the grid's, does not share): the noise sd of their data (the rows' ``noise_std``),
    the early-stopping rule of their ``meta.stopping`` and the epoch floor of their config, or the epochs their test
    history covers; then any option given to this report that disagrees with the runs. A value the runs did not
    record (a tidy CSV keeps only the config values that vary between runs) is left out."""
    tests = [records[f"{model}/s{seed}_test_last"] for model, per_seed in found.items() for seed in per_seed]
    stops = [r.results["meta"]["stopping"] for r in tests if r.results["meta"].get("stopping")]
    noise = [next((row.get("noise_std") for row in r.results["rows"] if row["metric"] == "accuracy"), None)
             or r.config.get("data.noise_std") for r in tests]
    ran = {"noise_std": ran_values(noise),
           "patience": ran_values(s.get("patience") for s in stops),
           "min_delta": ran_values(s.get("min_delta") for s in stops),
           "min_epochs": ran_values(r.config.get("trainer.min_epochs") for r in tests),
           "max_epochs": ran_values(s.get("max_epochs") for s in stops) if stops else
           ran_values(per_seed[s]["epochs"] for per_seed in found.values() for s in per_seed)}
    if stops:
        bounds = ", ".join(x for x in (ran["min_epochs"] and f"at least {ran['min_epochs']}",
                                       ran["max_epochs"] and f"cap {ran['max_epochs']}") if x)
        length = ("trained until val/acc had not risen" + (f" by more than {ran['min_delta']}" if ran["min_delta"] else "")
                  + (f" for {ran['patience']} epochs" if ran["patience"] else "") + (f" ({bounds})" if bounds else ""))
    else:
        length = f"{ran['max_epochs']} epoch{'' if ran['max_epochs'] == '1' else 's'}"
    text = (f"Noise sd {ran['noise_std']}; " if ran["noise_std"] else "Noise sd not recorded; ") + f"{length}; {seeds_text}."
    return text + unused_options_note(args, given_options(_parser(), args.argv), ran, bool(stops))


def _cell(values: list[float]) -> str:
    if not values:
        return "--"
    m, sd = mean_sd(values)
    return f"{m:.1f}" if len(values) == 1 else f"{m:.1f} ± {sd:.1f}"  # one seed has no spread to show


def report(args: argparse.Namespace) -> str:
    """Per-model accuracies (mean ± sd over seeds, per seed) and the full model's paired margins vs the paper's."""
    found, _, seeds_text, records = _measured(args)
    if not found:
        return refuse_empty_report(args)
    rows = []
    for model, per_seed in found.items():
        seeds = sorted(per_seed)

        def get(key: str, per_seed: dict = per_seed, seeds: list = seeds) -> list:
            return [per_seed[s][key] for s in seeds if per_seed[s][key] is not None]

        rows.append([model, f"{int(per_seed[seeds[0]]['params']):,}" if per_seed[seeds[0]]["params"] else "--",
                     str(len(seeds)), _cell(get("at_best_val")), _cell(get("best_test")),
                     _cell(get("best_test_paper")),
                     " / ".join(f"{v:.1f}" for v in get("best_test")), ", ".join(str(v) for v in get("epochs")),
                     f"{sum(get('stopped_early'))} of {len(seeds)}",
                     # per seed, in order; a seed that never left the plateau says so rather than vanishing
                     ", ".join("never" if per_seed[s]["left_chance"] is None else str(per_seed[s]["left_chance"])
                               for s in seeds),
                     f"{MODELS[model][1]:.2f}"])
    parts = [report_header(args, records, found, seeds_text),
             markdown_table(["model", "params", "seeds", "test acc. at best val epoch (%)", "best test acc. (%)",
                             f"best test acc., epochs 1-{PAPER_EPOCHS} (%)",
                             "best test acc., per seed", "epochs trained", "stopped early",
                             f"first epoch >= {LEFT_CHANCE:.0f} %", "paper (%)"], rows)]
    rows = []
    full = found.get("full", {})
    for model, per_seed in found.items():
        if model == "full":
            continue
        paper = MODELS["full"][1] - MODELS[model][1]
        cells = []
        for key in READINGS:
            diffs = [full[s][key] - per_seed[s][key] for s in sorted(set(full) & set(per_seed))
                     if full[s][key] is not None and per_seed[s][key] is not None]
            if not diffs:
                cells += ["--", "--"]
                continue
            m, sd = mean_sd(diffs)
            if len(diffs) == 1:  # a sign, but no spread to judge it against
                verdict = ("same sign" if m * paper > 0 else "opposite sign" if m else "tie") + ", one seed"
            else:
                verdict = ("not resolved (|margin| <= sd)" if abs(m) <= sd else
                           "same sign" if m * paper > 0 else "opposite sign")
            spread = f" ± {sd:.1f}" if len(diffs) > 1 else ""
            cells += [f"{m:+.1f}{spread} ({sum(d > 0 for d in diffs)} of {len(diffs)} ahead)", verdict]
        rows.append([model, f"{paper:+.2f}", *cells])
    parts.append("Full model minus each other model, paired by seed (points):\n\n" + markdown_table(
        ["full minus", "paper", *(c for name in READINGS.values() for c in (name, "verdict"))], rows))
    parts.append(ordering(found))
    return "\n\n".join(parts)


def ordering(found: dict[str, dict[int, dict]]) -> str:
    """Table 1's claim is an ordering (the full model first): the models ranked by mean accuracy, both readings,
    beside the paper's ranking. Ties in the paper (62.72 twice) are written with ``=``."""

    def ranked(means: dict[str, float], digits: int) -> str:
        order = sorted(means, key=means.get, reverse=True)
        text = order[0]
        for before, model in pairwise(order):
            text += (" = " if round(means[before], digits) == round(means[model], digits) else " > ") + model
        return text

    lines = [f"- paper (best test acc.): {ranked({m: MODELS[m][1] for m in MODELS}, 2)}"]
    # Means over the seeds every model has finished, so that no model is ranked on a different draw of seeds.
    common = sorted(set.intersection(*(set(per_seed) for per_seed in found.values())))
    for key, name in READINGS.items():
        means = {m: mean_sd([per_seed[s][key] for s in common])[0] for m, per_seed in found.items()
                 if common and all(per_seed[s][key] is not None for s in common)}
        if means:
            lines.append(f"- ours, {name} (mean over seeds {', '.join(map(str, common))}): {ranked(means, 1)}")
    return "Ordering:\n\n" + "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """The driver's options (:func:`parse_args` parses and checks them; a report asks which were given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arg(parser)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "mmca_avmnist_table1")
    parser.add_argument("--root", type=Path, default=None,
                        help="the data folder (default: the config's, the offline stand-in data/avmnist_lite)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--noise-std", type=float, default=1.0,
                        help="covariate noise sd of every model's data (default: 1.0; the config alone keeps 0.2)")
    parser.add_argument("--max-epochs", type=positive_int, default=100, help="epochs, or the cap with --patience")
    parser.add_argument("--patience", type=int, default=None,
                        help="stop after this many epochs without a rise of val/acc (the shared early-stopping rule)")
    parser.add_argument("--min-delta", type=float, default=0.0,
                        help="the smallest rise of val/acc that counts as an improvement (--patience); one of the "
                             "stand-in's 500 validation pairs is 0.002")
    parser.add_argument("--min-epochs", type=int, default=None,
                        help="train at least this many epochs before the early-stopping rule may end a run "
                             "(--patience)")
    parser.add_argument("--wait-for-score", type=float, default=None,
                        help="never stop a run before its best val/acc has passed this value (--patience), e.g. 0.2, "
                             "twice chance: at noise sd 1.0 a model without cross-attention can sit at chance past "
                             "a 100-epoch minimum")
    add_overlay_arg(parser, "each model's config (and, in `test`, after each run's saved config)",
                    "a file with `trainer: {accelerator: gpu}` for a GPU")
    add_job_args(parser)
    add_report_args(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a value no run could use is refused in one line (exit 2) before any job or
    record is written, rather than failing every fit alike after writing its folder."""
    parser = _parser()
    args = parse_driver_args(parser, argv, __file__)
    if args.noise_std < 0:
        parser.error(f"--noise-std {args.noise_std}: a noise sd is 0 or more (default 1.0)")
    if args.min_epochs is not None and not 1 <= args.min_epochs <= args.max_epochs:
        parser.error(f"--min-epochs {args.min_epochs} must lie in [1, --max-epochs {args.max_epochs}]")
    # fit_jobs passes --min-delta and --wait-for-score only with the early-stopping rule; --min-epochs it passes
    # always, but without that rule every run trains all its --max-epochs, so the floor would do nothing
    check_early_stopping_args(parser, args, rounds="epochs without a rise of val/acc", rise="rise of val/acc",
                              length="--max-epochs", needs_patience={"wait_for_score": "holds off early stopping",
                                                                     "min_epochs": "is a floor under early stopping"})
    if args.wait_for_score is not None and not 0 <= args.wait_for_score <= 1:
        parser.error(f"--wait-for-score {args.wait_for_score}: val/acc is a fraction, so a run could never pass "
                     "it; give a value in [0, 1] (e.g. 0.2, twice chance)")
    if args.root is not None:
        # Runs start in the repository (runner.run_job), so a relative root is resolved here, where it was typed.
        args.root = args.root.resolve()
        standin = (REPO / STANDIN_ROOT).resolve()  # built on first use when missing; any other root must exist
        if args.stage != "report" and args.root != standin and not args.root.is_dir():
            parser.error(f"--root {args.root}: no such folder; point it at an avMNIST folder in MultiBench's layout, "
                         f"or drop it to use the offline stand-in, built on first use at {STANDIN_ROOT}")
    args.out = args.out.resolve()
    check_out(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    drive(parse_args(argv), fit_jobs, test_jobs, report, parse_args)


if __name__ == "__main__":
    main()

"""I2CL calibrated by the paper's recipe and by the public code's, and the ablations between them, over seeds.

    python experiments/i2cl_recipes.py fit  --models gemma --recipes sublayer_noise public_code paper --seeds 0 1 2 3 4
    python experiments/i2cl_recipes.py test --models gemma --recipes sublayer_noise public_code paper zero_shot
    python experiments/i2cl_recipes.py report --models gemma smollm2 --csv experiments/results/i2cl_recipes_cpu.csv
    python experiments/i2cl_recipes.py report --models gemma smollm2 --out experiments/results/i2cl_recipes_cpu.csv

Every run is ``configs/i2cl/offline.yaml`` (the movie-review stand-in for MR, 5 demonstrations per class drawn by
``data_seed``, 500 class-balanced evaluation queries fixed by ``eval_seed``), on one of the two offline models, with
one recipe's options on top (:data:`RECIPES`). A recipe that calibrates fits ``[i2cl]`` alone (so its noise draws do
not depend on other methods) and tests it from its last checkpoint; ``few_shot`` is a test-only run of the few-shot
reference (single-newline separator) and zero-shot, ``zero_shot`` one of zero-shot alone (it does not depend on the
seed: the evaluation queries are the same for every seed and recipe, so one seed's run stands for all). Jobs, logs
and resumption work as in ``experiments/runner.py``.

The report gives, per model and recipe, I2CL's accuracy (mean ± sd and per seed), its macro-F1 per seed, how many
seeds predict a single label (macro-F1 below 0.4 on these two balanced classes), how many are at least zero-shot,
and the calibration loss at the end (mean of the last 10 logged steps), against the few-shot reference. ``report
--csv FILE`` also writes the grid as a tidy CSV (``experiments/tidy.py``, with those last 10 logged losses of each
fit), and ``report --out FILE.csv`` makes the same tables from that file alone.
"""

from __future__ import annotations

import argparse
import re
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
    markdown_table,
    mean_sd,
    parse_driver_args,
    refuse_empty_report,
    tested_cells,
)
from tidy import RunRecord, add_report_args, check_out, grid_records

CONFIG = REPO / "configs" / "i2cl" / "offline.yaml"
#: model -> its overlay on offline.yaml (None: the base config's SmolLM2-135M-Instruct).
MODELS: dict[str, str | None] = {"smollm2": None, "gemma": "configs/i2cl/offline/gemma.yaml"}
PAPER = ["--config", "configs/i2cl/offline/paper_text.yaml"]
PUBLIC = ["--config", "configs/i2cl/offline/public_code.yaml"]
HOOK = "--model.init_args.net.init_args.hook_point"
#: recipe -> (what it is, extra CLI arguments). The defaults (offline.yaml) are ``sublayer_noise``: the paper's text
#: (hooks on what enters the residual stream, a cosine from 1e-2 to 1e-5, a shuffle per epoch) with the noise scaled
#: by each injected sub-layer output, as the authors' code scales it. The runs of 2026-11-26 were made while the
#: defaults were first the paper's text and then the public code's; each resolves to the same config as here.
RECIPES: dict[str, tuple[str, list[str]]] = {
    "paper": ("paper_text.yaml: Eq. 6 (stream noise), hooks on the stream writes, cosine to 1e-5, epoch shuffles",
              PAPER),
    "sublayer_noise": ("offline.yaml (the default): the paper's text with the noise scaled by the sub-layer output", []),
    "public_code": ("public_code.yaml: sub-layer noise, hooks on the modules, warm-up + cosine to 0, fresh draws",
                    PUBLIC),
    "public_code_write": ("public_code.yaml with the hooks on the stream writes (after Gemma's post-norms)",
                          [*PUBLIC, HOOK, "write"]),
    "public_code_schedule": ("public_code.yaml with the default schedule and epoch shuffles",
                             [*PUBLIC, "--model.init_args.lr_schedule", "cosine", "--model.init_args.lr_min", "1e-5",
                              "--model.init_args.warmup_fraction", "0", "--data.init_args.calibration_batches", "epoch"]),
    "no_noise": ("public_code.yaml without noise (gamma 0)", [*PUBLIC, "--model.init_args.gamma", "0"]),
    "public_code_add": ("public_code.yaml with the code's other injection, a + relu(lambda) v (beta fixed at 1)",
                        [*PUBLIC, "--model.init_args.inject_method", "add"]),
    "public_code_gamma_0.003": (("public_code.yaml with gamma 0.003: the relative noise norm gamma sqrt(D) of "
                                 "Llama-2-7b at 0.001 (D = 4096) on D = 576-640"),
                                [*PUBLIC, "--model.init_args.gamma", "0.003"]),
    "public_code_gamma_0.01": ("public_code.yaml with ten times the noise (gamma 0.01)",
                               [*PUBLIC, "--model.init_args.gamma", "0.01"]),
    "fixed_beta": ("offline.yaml (the default) with beta held at 1, lambda calibrated alone (a + lambda v)",
                   ["--model.init_args.inject_method", "fixed_beta"]),
    "few_shot": ("few-shot reference (demonstrations separated by a single newline) and zero-shot", []),
    "zero_shot": ("zero-shot alone (the same for every seed: the evaluation queries do not depend on it)", []),
}
#: Test-only recipes: the methods they score, with no calibration.
REFERENCES = {"few_shot": "[zero_shot,few_shot]", "zero_shot": "[zero_shot]"}


def _model_args(model: str) -> list[str]:
    overlay = MODELS[model]
    return ["--config", str(CONFIG)] + ([] if overlay is None else ["--config", overlay])


def _folder(args: argparse.Namespace, model: str, recipe: str, seed: int, stage: str) -> Path:
    return args.out / model / recipe / f"s{seed}_{stage}"


def fit_jobs(args: argparse.Namespace) -> list[Job]:
    jobs = []
    for seed in args.seeds:
        for model in args.models:
            for recipe in args.recipes:
                if recipe in REFERENCES:
                    continue
                argv = ["fit", *_model_args(model), *RECIPES[recipe][1], "--model.init_args.methods", "[i2cl]",
                        "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
                        *logger_args(args.out, f"{model}/{recipe}", f"s{seed}_fit")]
                jobs.append(Job(f"fit {model} {recipe} s{seed}", argv, _folder(args, model, recipe, seed, "fit")))
    return jobs


def test_jobs(args: argparse.Namespace) -> list[Job]:
    jobs = []
    for seed in args.seeds:
        for model in args.models:
            for recipe in args.recipes:
                folder = _folder(args, model, recipe, seed, "test")
                name = f"test {model} {recipe} s{seed}"
                if recipe in REFERENCES:
                    argv = ["test", *_model_args(model), "--model.init_args.methods", REFERENCES[recipe],
                            "--seed_everything", str(seed), "--data.init_args.data_seed", str(seed),
                            *logger_args(args.out, f"{model}/{recipe}", folder.name)]
                    jobs.append(Job(name, argv, folder))
                    continue
                fit = _folder(args, model, recipe, seed, "fit")
                argv = ["test", "--config", str(fit / "config.yaml"), "--ckpt_path", str(fit / "checkpoints" / "last.ckpt"),
                        *logger_args(args.out, f"{model}/{recipe}", folder.name)]
                jobs.append(Job(name, argv, folder, after=[fit]))
    return jobs


#: The logged calibration loss the report reads: the mean of its last 10 points is a fit's final loss.
LOSS_TAG, LOSS_POINTS = "train/loss/i2cl", 10


def _rows(record: RunRecord | None) -> dict[tuple[str, str], float]:
    """``{(metric, method): value}`` of one test run (empty if it has not finished)."""
    if record is None or record.results is None:
        return {}
    return {(r["metric"], r["method"]): float(r["value"]) for r in record.results["rows"] if "method" in r}


def _final_loss(record: RunRecord | None) -> float | None:
    """Mean of the last 10 logged calibration losses of a fit."""
    values = record.scalars.get(LOSS_TAG, {}) if record is not None else {}
    if not values:
        return None
    last = [values[k] for k in sorted(values)[-LOSS_POINTS:]]
    return sum(last) / len(last)


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    m, sd = mean_sd(values)
    return f"{m:.3f} ± {sd:.3f}" if len(values) > 1 else f"{m:.3f}"


#: A test run of the grid: ``<model>/<recipe>/s<seed>_test``.
TEST_RUN = re.compile(rf"^(?P<model>{'|'.join(MODELS)})/(?P<recipe>{'|'.join(RECIPES)})/s(?P<seed>\d+)_test$")


def report(args: argparse.Namespace) -> str:
    """The tables of the finished runs under ``--out`` (a run folder, or the tidy CSV that ``report --csv`` wrote),
    writing that CSV when ``--csv`` is given."""
    records = grid_records(args, {LOSS_TAG: LOSS_POINTS})
    if not any(record.results is not None for record in records.values()):
        return refuse_empty_report(args)
    # Without --models/--recipes/--seeds: every one with a finished test, not the defaults (Gemma, seeds 0-4).
    args = tested_cells(args, _parser(), records, TEST_RUN, {"model": list(MODELS), "recipe": list(RECIPES)})

    def record(model: str, recipe: str, seed: int, stage: str) -> RunRecord | None:
        return records.get(f"{model}/{recipe}/s{seed}_{stage}")

    out = []
    for model in args.models:
        reference: dict[int, dict[tuple[str, str], float]] = {
            s: {**_rows(record(model, "zero_shot", s, "test")), **_rows(record(model, "few_shot", s, "test"))}
            for s in args.seeds}
        few = [reference[s][("accuracy", "few_shot")] for s in args.seeds if ("accuracy", "few_shot") in reference[s]]
        # zero-shot does not depend on the seed (fixed evaluation queries): any seed's run stands for the others
        any_zero = next((r[("accuracy", "zero_shot")] for r in reference.values() if ("accuracy", "zero_shot") in r), None)
        rows = []
        for recipe in [r for r in args.recipes if r not in REFERENCES]:
            seeds, acc, f1, zero, losses = [], [], [], [], []
            for s in args.seeds:
                r = _rows(record(model, recipe, s, "test"))
                if ("accuracy", "i2cl") not in r:
                    continue
                seeds.append(s)
                acc.append(r[("accuracy", "i2cl")])
                f1.append(r[("macro_f1", "i2cl")])
                z = reference[s].get(("accuracy", "zero_shot"), any_zero)
                if z is not None:
                    zero.append((r[("accuracy", "i2cl")], z))
                loss = _final_loss(record(model, recipe, s, "fit"))
                if loss is not None:
                    losses.append(loss)
            if not seeds:
                continue
            rows.append([
                recipe, ", ".join(map(str, seeds)), _cell(acc), ", ".join(f"{a:.3f}" for a in acc),
                ", ".join(f"{x:.3f}" for x in f1), str(sum(x < 0.4 for x in f1)),
                f"{sum(a >= z for a, z in zero)} of {len(zero)}", _cell([z for _, z in zero]),
                ", ".join(f"{x:.2f}" for x in losses) or "-",
            ])
        out.append(f"### {model}\n")
        out.append(f"Few-shot reference (single newline): {_cell(few)} over seeds "
                   f"{', '.join(str(s) for s in args.seeds if ('accuracy', 'few_shot') in reference[s]) or '-'} "
                   f"(per seed {', '.join(f'{x:.3f}' for x in few) or '-'}).\n")
        out.append(markdown_table(
            ["recipe", "seeds", "I2CL accuracy", "per seed", "macro-F1 per seed", "one-label seeds",
             "seeds >= zero-shot", "zero-shot", "final calibration loss per seed"], rows))
        out.append("")
    out.append("Recipes:\n")
    out.extend(f"- `{name}`: {what}" for name, (what, _) in RECIPES.items() if name in args.recipes)
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    """The driver's options (:func:`parse_args` parses and checks them; a report asks which were given)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_arg(p)
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=["gemma"])
    p.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=["paper", "sublayer_noise", "public_code", "zero_shot"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "i2cl_recipes")
    add_job_args(p)
    add_report_args(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _parser()
    args = parse_driver_args(p, argv, __file__)
    args.out = args.out.resolve()
    check_out(p, args)
    return args


def main(argv: list[str] | None = None) -> None:
    drive(parse_args(argv), fit_jobs, test_jobs, report, parse_args)


if __name__ == "__main__":
    main()

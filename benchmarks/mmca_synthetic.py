"""Fit and test several mmca synthetic configs, pool their result rows, and draw Figs. 2, 3, 5, 6 from them.

    OMP_NUM_THREADS=1 python benchmarks/mmca_synthetic.py --out /tmp/mmca \\
        configs/mmca/synthetic.yaml configs/mmca/synthetic/fig2_lsa.yaml ...

Each config is built through the project's CLI (``LitICLCLI(run=False)``), so what is measured is what the YAML
says; an overlay (``configs/mmca/synthetic/<variant>.yaml``) runs on its base (``configs/mmca/synthetic.yaml``).
``--set key=value`` adds CLI overrides to every run (e.g. ``--set data.init_args.data_seed=1``). Writes
``rows.json`` / ``rows.csv`` (tidy rows, each tagged with its ``config``, ``fit_s`` and ``test_s``), one PNG per
figure, and prints the headline table: ICL error and MSE at the largest ``L_te`` per method at its trained
depth, next to the Bayes predictor and the closed-form limits of :mod:`lit_icl.mmca.theory`.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI, process_defaults
from lit_icl.mmca.synthetic.figures import mmca_figures
from lit_icl.mmca.theory import bayes_mse, lsa_error_floor, one_parameter_loss


def config_files(config: str) -> list[str]:
    """``[config]`` for a base, ``[base, config]`` for an overlay ``<experiment>/<variant>.yaml``."""
    base = Path(config).parent.with_suffix(".yaml")
    return [str(base), config] if base.is_file() else [config]


def run_config(config: str, out: Path, overrides: list[str]) -> list[dict]:
    args = [
        *(arg for path in config_files(config) for arg in ("--config", path)),
        "--trainer.logger.init_args.save_dir",
        str(out / "runs"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    ]
    for item in overrides:
        key, value = item.split("=", 1)
        args += [f"--{key}", value]
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=args)  # the defaults of python -m lit_icl
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    test_s = time.perf_counter() - t0
    name = str(cli.trainer.logger.name)  # the run name, e.g. mmca_synthetic_fig2_lsa
    steps = int(cli.trainer.global_step)
    print(f"{name}: {steps} steps, fit {fit_s:.1f} s, test {test_s:.1f} s", flush=True)
    return [
        dict(
            r,
            config=name,
            fit_s=round(fit_s, 2),
            test_s=round(test_s, 2),
            steps=steps,
            data_seed=cli.datamodule.data_seed,
        )
        for r in cli.model.test_rows
    ]


def headline(rows: list[dict]) -> list[str]:
    """Per config and method: icl_error and mse at the largest L_te, at the net's trained depth."""
    lines = []
    longest = max(r["context_length"] for r in rows if r["metric"] == "icl_error")
    trained = {}
    for r in rows:
        if r["metric"] == "alpha_hat":
            trained[r["config"]] = r["depth"]
    seen = set()
    for r in rows:
        if r["metric"] != "icl_error" or r["context_length"] != longest:
            continue
        depth = r.get("depth")
        if depth is not None and depth != trained.get(r["config"], depth):
            continue
        key = (
            (r["method"], depth)
            if r["method"] in ("bayes", "sample_mean")
            else (r["config"], r["method"], depth)
        )
        if key in seen:
            continue
        seen.add(key)
        mse = next(
            q["value"]
            for q in rows
            if q["metric"] == "mse"
            and q["config"] == r["config"]
            and q["method"] == r["method"]
            and q.get("depth") == depth
            and q["context_length"] == longest
        )
        lines.append(
            f"{r['config']:32s} {r['method']:16s} T={depth!s:5s} L_te={longest}: icl_error={r['value']:.5f} "
            f"mse={mse:.5f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--set", action="append", default=[], help="CLI override key=value for every run")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    process_defaults()  # as python -m lit_icl does
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for config in args.configs:
        rows += run_config(config, args.out, args.set)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    keys = sorted({k for r in rows for k in r})
    with open(args.out / "rows.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    for name, fig in mmca_figures(rows).items():
        fig.savefig(args.out / f"{name}.png", dpi=110)
    nr = (0.0, 5.0)
    print("\n".join(headline(rows)))
    print(
        f"closed forms (L -> inf, ||m|| ~ U[0, 5]): Bayes mse E[1/Z] = {bayes_mse(nr):.5f}; LSA floor = "
        f"{lsa_error_floor(nr):.5f}; one-parameter LCA T=10 at alpha*: {float(one_parameter_loss(2 / 27, 10, nr)):.5f}"
    )


if __name__ == "__main__":
    main()

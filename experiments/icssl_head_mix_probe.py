"""Which bandwidths does a trained IC-SSL model's Laplacian rely on? Re-test it with its first layer's heads reweighted.

    python experiments/icssl_head_mix_probe.py runs/icssl_linear_lr/tuned_linear_no_spiral/s1_test_manifolds ...

The first layer of the in-context Laplacian (``TF^L``, Sec. 3.1) mixes one RBF-attention head per bandwidth
``sigma_h`` with weights ``a'_h`` (``laplacian.layers.0.value_lap``; they start equal, ``1 / heads`` each, and
sum to one in ``random_walk`` output). This probe takes a finished ``test`` run (its folder holds the resolved
``config.yaml`` and a ``results.json`` whose ``meta.checkpoint`` names the tested checkpoint), replaces those
weights by each variant below (everything else as trained), tests again on the same episodes, and prints the
accuracy at each label count. ``as_trained`` repeats the original test and must match its ``results.json``.

It answers a question about transfer, not a training recipe: a model trained on some manifolds and tested on
another (Tables 2-4's OOD cells) keeps the mix its training manifolds favour; if the test manifold needs another
mix, the reweighted model scores higher there. Variants name heads by their position, narrowest first, as in
the shipped configs (``lap_bandwidths: [0.004, 0.01, 0.025, 0.06]``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from lit_icl.core.results import load_results

KEY = "net.representation.laplacian.layers.0.value_lap"
#: variant -> first-layer head weights a'_h (None: as trained). Each keeps the weights' sum at one.
VARIANTS: dict[str, list[float] | None] = {
    "as_trained": None,
    "narrowest_only": [1.0, 0.0, 0.0, 0.0],
    "two_narrow": [0.5, 0.5, 0.0, 0.0],
    "two_wide": [0.0, 0.0, 0.5, 0.5],
}
BASELINES = ("class_prior", "labeled_majority")


def reweighted_checkpoint(checkpoint: Path, weights: list[float] | None, out: Path) -> Path:
    """A copy of ``checkpoint`` with the first Laplacian layer's head weights set to ``weights``."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    current = ckpt["state_dict"].get(KEY)
    if current is None:
        raise SystemExit(f"{checkpoint} has no {KEY}: only ORIG+E2E-ICL models (InContextEigenmap) have one")
    if weights is not None:
        if len(weights) != current.numel():
            raise SystemExit(f"{checkpoint} has {current.numel()} heads; the variant gives {len(weights)} weights")
        ckpt["state_dict"][KEY] = torch.tensor(weights, dtype=current.dtype)
    torch.save(ckpt, out)
    return out


def model_accuracies(results: dict) -> dict[tuple[str | None, int], float]:
    """``{(test manifold, labeled points): accuracy}`` of the model (not the baselines) in a ``results.json``."""
    return {(row.get("manifold"), row["n_labeled"]): row["value"] for row in results["rows"]
            if row["metric"] == "accuracy" and row["method"] not in BASELINES}


def probe(test_folder: Path, variants: dict[str, list[float] | None],
          work: Path) -> dict[str, dict[tuple[str | None, int], float]]:
    """Test the checkpoint behind ``test_folder`` once per variant: ``{variant: model_accuracies(...)}``."""
    config, results = test_folder / "config.yaml", test_folder / "results.json"
    if not (config.is_file() and results.is_file()):
        raise SystemExit(f"{test_folder} is not a finished test run (it needs config.yaml and results.json); "
                         "run the table driver's `test` stage first")
    checkpoint = Path(load_results(results)["meta"]["checkpoint"])
    found = {}
    for name, weights in variants.items():
        ckpt = reweighted_checkpoint(checkpoint, weights, work / f"{name}.ckpt")
        cmd = [sys.executable, "-m", "lit_icl", "test", "--config", str(config), "--ckpt_path", str(ckpt),
               "--trainer.logger.init_args.save_dir", str(work), "--trainer.logger.init_args.name", "probe",
               "--trainer.logger.init_args.version", name, "--trainer.enable_progress_bar", "false"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"test of variant {name} failed:\n{done.stderr[-3000:]}")
        found[name] = model_accuracies(load_results(work / "probe" / name))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_folders", nargs="+", type=Path, help="finished test runs (config.yaml + results.json)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    chosen = {name: VARIANTS[name] for name in args.variants}
    print("| run | test manifold | variant | accuracy at 3 / 21 / 39 labeled points (or the run's label counts) |\n"
          "|---|---|---|---|")
    for folder in args.test_folders:
        with tempfile.TemporaryDirectory() as tmp:
            for name, acc in probe(folder, chosen, Path(tmp)).items():
                for manifold in sorted({m for m, _ in acc}, key=str):
                    values = " / ".join(f"{acc[m, n]:.3f}" for m, n in sorted(acc) if m == manifold)
                    where = manifold or "all (pooled)"  # rows carry a manifold only with test_per_manifold
                    print(f"| {folder} | {where} | {name} | {values} |", flush=True)


if __name__ == "__main__":
    main()

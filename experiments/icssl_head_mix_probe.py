"""Which part of a trained IC-SSL model carries its accuracy? Re-test it with heads reweighted or parts swapped in.

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

With ``--donor DONOR_TEST_RUN`` it also swaps whole parts in from another trained model of the same
architecture (typically the in-distribution model of the manifold the OOD model is tested on): its
Laplacian stack (``TF^L``; or one of its parts: the learned initial matrix, layer 0, layer 1), its eigenmap stack
(``TF^E``), both (the representation), or the GD ICL head. The
part whose swap recovers the most of the donor's accuracy is where the OOD model loses it. ``donor_all`` swaps
everything and must match the donor's own test when both runs test the same episodes (same data seed and test
manifolds).

    python experiments/icssl_head_mix_probe.py runs/icssl_converged/tuned_linear_no_spiral/s0_test_manifolds \
        --donor runs/icssl_converged/tuned_linear_only_spiral/s0_test_manifolds --variants as_trained donor_head
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
#: variant -> the state-dict prefixes taken from the donor model (``--donor``).
SWAPS: dict[str, tuple[str, ...]] = {
    "donor_laplacian": ("net.representation.laplacian.",),
    # The Laplacian stack's parts (shipped configs: a learned initial matrix and two RBF-attention layers).
    "donor_laplacian_init": ("net.representation.laplacian.init_delta",),
    "donor_laplacian_layer0": ("net.representation.laplacian.layers.0.",),
    "donor_laplacian_layer1": ("net.representation.laplacian.layers.1.",),
    "donor_eigenmap": ("net.representation.eigenmap.",),
    "donor_representation": ("net.representation.",),
    "donor_head": ("net.head.",),
    "donor_all": ("net.",),
}
BASELINES = ("class_prior", "labeled_majority")


def edited_checkpoint(checkpoint: Path, out: Path, weights: list[float] | None = None,
                      donor: Path | None = None, prefixes: tuple[str, ...] = ()) -> Path:
    """A copy of ``checkpoint`` with the first Laplacian layer's head weights set to ``weights`` (if given) and
    every state-dict entry under ``prefixes`` taken from the ``donor`` checkpoint."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state = ckpt["state_dict"]
    if weights is not None:
        current = state.get(KEY)
        if current is None:
            raise SystemExit(f"{checkpoint} has no {KEY}: only ORIG+E2E-ICL models (InContextEigenmap) have one")
        if len(weights) != current.numel():
            raise SystemExit(f"{checkpoint} has {current.numel()} heads; the variant gives {len(weights)} weights")
        state[KEY] = torch.tensor(weights, dtype=current.dtype)
    if prefixes:
        if donor is None:
            raise SystemExit(f"swapping {', '.join(prefixes)} needs --donor (another model's finished test run)")
        donated = torch.load(donor, map_location="cpu", weights_only=False)["state_dict"]
        swapped = [k for k in state if k.startswith(prefixes)]
        mismatched = [k for k in swapped if k not in donated or donated[k].shape != state[k].shape]
        if not swapped or mismatched or {k for k in donated if k.startswith(prefixes)} != set(swapped):
            raise SystemExit(f"{donor} and {checkpoint} differ under {', '.join(prefixes)} (entries "
                             f"{mismatched[:3] or 'absent'}): the donor must be the same architecture")
        state.update({k: donated[k] for k in swapped})
    torch.save(ckpt, out)
    return out


def tested_checkpoint(test_folder: Path) -> Path:
    """The checkpoint a finished ``test`` run scored (its ``results.json`` ``meta.checkpoint``)."""
    if not ((test_folder / "config.yaml").is_file() and (test_folder / "results.json").is_file()):
        raise SystemExit(f"{test_folder} is not a finished test run (it needs config.yaml and results.json); "
                         "run the table driver's `test` stage first")
    return Path(load_results(test_folder / "results.json")["meta"]["checkpoint"])


def model_accuracies(results: dict) -> dict[tuple[str | None, int], float]:
    """``{(test manifold, labeled points): accuracy}`` of the model (not the baselines) in a ``results.json``."""
    return {(row.get("manifold"), row["n_labeled"]): row["value"] for row in results["rows"]
            if row["metric"] == "accuracy" and row["method"] not in BASELINES}


def probe(test_folder: Path, variants: list[str], work: Path,
          donor: Path | None = None) -> dict[str, dict[tuple[str | None, int], float]]:
    """Test the checkpoint behind ``test_folder`` once per variant (``VARIANTS`` or, with the ``donor`` test run,
    ``SWAPS``), on its own test config: ``{variant: model_accuracies(...)}``."""
    checkpoint = tested_checkpoint(test_folder)
    donor_checkpoint = tested_checkpoint(donor) if donor is not None else None
    found = {}
    for name in variants:
        ckpt = edited_checkpoint(checkpoint, work / f"{name}.ckpt", weights=VARIANTS.get(name),
                                 donor=donor_checkpoint, prefixes=SWAPS.get(name, ()))
        cmd = [sys.executable, "-m", "lit_icl", "test", "--config", str(test_folder / "config.yaml"),
               "--ckpt_path", str(ckpt), "--trainer.logger.init_args.save_dir", str(work),
               "--trainer.logger.init_args.name", "probe", "--trainer.logger.init_args.version", name,
               "--trainer.enable_progress_bar", "false"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"test of variant {name} failed:\n{done.stderr[-3000:]}")
        found[name] = model_accuracies(load_results(work / "probe" / name))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_folders", nargs="+", type=Path, help="finished test runs (config.yaml + results.json)")
    parser.add_argument("--variants", nargs="+", choices=sorted([*VARIANTS, *SWAPS]), default=None,
                        help="default: the head-weight variants, and with --donor the swaps too")
    parser.add_argument("--donor", type=Path, default=None,
                        help="a finished test run of another model of the same architecture, for the donor_* swaps")
    args = parser.parse_args(argv)
    chosen = args.variants or [*VARIANTS, *(SWAPS if args.donor is not None else ())]
    print("| run | test manifold | variant | accuracy at 3 / 21 / 39 labeled points (or the run's label counts) |\n"
          "|---|---|---|---|")
    for folder in args.test_folders:
        with tempfile.TemporaryDirectory() as tmp:
            for name, acc in probe(folder, chosen, Path(tmp), donor=args.donor).items():
                for manifold in sorted({m for m, _ in acc}, key=str):
                    values = " / ".join(f"{acc[m, n]:.3f}" for m, n in sorted(acc) if m == manifold)
                    where = manifold or "all (pooled)"  # rows carry a manifold only with test_per_manifold
                    print(f"| {folder} | {where} | {name} | {values} |", flush=True)


if __name__ == "__main__":
    main()

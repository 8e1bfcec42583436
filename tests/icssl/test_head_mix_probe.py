"""experiments/icssl_head_mix_probe.py: re-testing a trained model with its Laplacian heads reweighted or parts swapped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_script
from icssl.helpers import tiny_args

from lit_icl.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "icssl_head_mix_probe.py"


@pytest.fixture(scope="module")
def probe_script():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def tested_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("probe")
    main(["fit", *tiny_args(root, name="fit")])
    ckpt = root / "runs" / "fit" / "version_0" / "checkpoints" / "last.ckpt"
    main(["test", *tiny_args(root, name="test"), "--ckpt_path", str(ckpt)])
    return root / "runs" / "test" / "version_0"


@pytest.mark.slow  # 21 s: two probe test runs; the default suite keeps the probe's refusal tests (under 10 minutes)
def test_as_trained_repeats_the_original_test_and_a_variant_changes_only_the_head_weights(
        probe_script, tested_run: Path, tmp_path: Path) -> None:
    found = probe_script.probe(tested_run, ["as_trained", "narrowest_only"], tmp_path)
    original = probe_script.model_accuracies(json.loads((tested_run / "results.json").read_text()))
    assert found["as_trained"] == original and len(original) == 3  # the tiny run's three label ratios
    trained = torch.load(json.loads((tested_run / "results.json").read_text())["meta"]["checkpoint"],
                         map_location="cpu", weights_only=False)["state_dict"]
    changed = torch.load(tmp_path / "narrowest_only.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert torch.equal(changed[probe_script.KEY], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert all(torch.equal(trained[k], changed[k]) for k in trained if k != probe_script.KEY)


def test_a_folder_that_is_not_a_finished_test_run_is_refused_with_the_fix(probe_script, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="is not a finished test run .* run the table driver's `test` stage first"):
        probe_script.probe(tmp_path, ["as_trained"], tmp_path)


def test_a_variant_with_the_wrong_number_of_heads_is_refused(probe_script, tested_run: Path, tmp_path: Path) -> None:
    checkpoint = Path(json.loads((tested_run / "results.json").read_text())["meta"]["checkpoint"])
    with pytest.raises(SystemExit, match="has 4 heads; the variant gives 2 weights"):
        probe_script.edited_checkpoint(checkpoint, tmp_path / "x.ckpt", weights=[0.5, 0.5])


@pytest.mark.slow  # 18 s: two more test runs of the probe
def test_the_command_prints_one_row_per_variant_and_test_manifold(probe_script, tested_run: Path, capsys) -> None:
    probe_script.main([str(tested_run), "--variants", "as_trained", "two_wide"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {tested_run} |")]
    original = probe_script.model_accuracies(json.loads((tested_run / "results.json").read_text()))
    expected = " / ".join(f"{original[k]:.3f}" for k in sorted(original))
    # The tiny run tests one pooled set (no test_per_manifold), so its rows name no manifold.
    assert rows[0] == f"| {tested_run} | all (pooled) | as_trained | {expected} |"
    assert len(rows) == 2 and rows[1].startswith(f"| {tested_run} | all (pooled) | two_wide | ")


@pytest.fixture(scope="module")
def donor_run(tmp_path_factory) -> Path:
    """A second model of the same architecture (another seed), tested on the same episodes as ``tested_run``."""
    root = tmp_path_factory.mktemp("donor")
    main(["fit", *tiny_args(root, name="fit"), "--seed_everything", "7"])
    ckpt = root / "runs" / "fit" / "version_0" / "checkpoints" / "last.ckpt"
    main(["test", *tiny_args(root, name="test"), "--ckpt_path", str(ckpt)])
    return root / "runs" / "test" / "version_0"


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow  # 20 s: a second fit and two probe test runs
def test_a_swap_takes_exactly_the_donors_part_and_donor_all_repeats_the_donors_test(
        probe_script, tested_run: Path, donor_run: Path, tmp_path: Path) -> None:
    found = probe_script.probe(tested_run, ["donor_head", "donor_all"], tmp_path, donor=donor_run)
    mine, donor = (_state(probe_script.tested_checkpoint(run)) for run in (tested_run, donor_run))
    swapped = _state(tmp_path / "donor_head.ckpt")
    heads = [k for k in mine if k.startswith("net.head.")]
    assert heads and all(torch.equal(swapped[k], donor[k]) for k in heads)
    assert all(torch.equal(swapped[k], mine[k]) for k in mine if k not in heads)
    assert not all(torch.equal(mine[k], donor[k]) for k in heads)  # the seeds did train different heads
    # Same episodes (same data seed and config): the fully swapped model scores what the donor scored.
    assert found["donor_all"] == probe_script.model_accuracies(json.loads((donor_run / "results.json").read_text()))


def test_a_swap_without_a_donor_or_from_another_architecture_is_refused(
        probe_script, tested_run: Path, tmp_path: Path) -> None:
    checkpoint = probe_script.tested_checkpoint(tested_run)
    with pytest.raises(SystemExit, match="needs --donor"):
        probe_script.edited_checkpoint(checkpoint, tmp_path / "x.ckpt", prefixes=("net.head.",))
    other = torch.load(checkpoint, map_location="cpu", weights_only=False)
    other["state_dict"] = {k: v for k, v in other["state_dict"].items() if not k.startswith("net.head.mlp.")}
    torch.save(other, tmp_path / "other.ckpt")
    with pytest.raises(SystemExit, match="differ under net.head.* the donor must be the same architecture"):
        probe_script.edited_checkpoint(checkpoint, tmp_path / "x.ckpt", donor=tmp_path / "other.ckpt",
                                       prefixes=("net.head.",))


def test_every_swap_names_a_part_of_the_shipped_model(probe_script, tested_run: Path) -> None:
    state = _state(probe_script.tested_checkpoint(tested_run))
    for name, prefixes in probe_script.SWAPS.items():
        assert any(k.startswith(prefixes) for k in state), name

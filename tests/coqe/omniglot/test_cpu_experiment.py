"""The CPU-scale CoQE driver (experiments/coqe_omniglot_cpu.py): its Pareto check, table and figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[3] / "experiments/coqe_omniglot_cpu.py"


@pytest.fixture(scope="module")
def driver():
    spec = importlib.util.spec_from_file_location("coqe_omniglot_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pareto_dominance(driver) -> None:
    others = [(0.95, 0.20), (0.60, 0.90), (0.92, 0.70), (0.90, 0.65)]
    assert driver.dominated_by((0.91, 0.66), others) == [(0.92, 0.70)]
    assert driver.dominated_by((0.93, 0.71), others) == []
    assert driver.dominated_by((0.90, 0.65), others) == [(0.92, 0.70)]  # itself is not a dominator


def _fake_run(folder: Path, arm: str, acc: dict[str, float], fit_s: float) -> None:
    out = folder / arm / "version_1"
    out.mkdir(parents=True)
    rows = [{"metric": "accuracy", "evaluator": k, "value": v} for k, v in acc.items()]
    (out / "results.json").write_text(json.dumps({"rows": rows, "meta": {"trained_steps": 4000}}))
    (folder / "times.json").write_text(json.dumps({"fit_s": fit_s, "test_s": 30.0}))


def test_collect_and_table_average_over_seeds(driver, tmp_path) -> None:
    _fake_run(tmp_path / "coqe/seed0", "coqe", {"icl": 0.9, "iwl": 0.6, "iwl_static": 0.8}, 600)
    _fake_run(tmp_path / "coqe/seed1", "coqe", {"icl": 0.8, "iwl": 0.7, "iwl_static": 0.9}, 700)
    _fake_run(tmp_path / "transformer_bursty/seed0", "transformer_bursty", {"icl": 0.95, "iwl": 0.65}, 500)
    found = driver.collect(tmp_path)
    assert sorted(found) == ["coqe", "transformer_bursty"] and sorted(found["coqe"]) == [0, 1]
    text = driver.table(found)
    assert "| `coqe` | 0, 1 | 0.850 ± 0.071 | 0.650 ± 0.071 | 0.850 ± 0.071 | 4000 | 600-700 |" in text
    assert "| `transformer_bursty` | 0 | 0.950 ± 0.000 | 0.650 ± 0.000 | - |" in text
    assert "CoQE seed 0 (0.900, 0.600): dominated by (0.950, 0.650)" in text
    assert "CoQE seed 1 (0.800, 0.700): not dominated" in text
    driver.figure(found, tmp_path / "fig.png")  # no curves in the fake runs: empty panels, still a figure
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"


def test_transformer_curves_reads_tensorboard_and_draws(tmp_path, capsys) -> None:
    from torch.utils.tensorboard import SummaryWriter

    spec = importlib.util.spec_from_file_location("coqe_transformer_curves", SCRIPT.with_name("coqe_transformer_curves.py"))
    curves = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curves)
    run = tmp_path / "run"
    with SummaryWriter(run) as w:
        for step in (249, 499, 999, 1999):
            w.add_scalar("val/acc/icl", 0.5 + step / 10_000, step)
            w.add_scalar("val/acc/iwl", 0.1, step)
    got = curves.curves(run)
    assert [s for s, _ in got["val/acc/icl"]] == [249, 499, 999, 1999]
    assert abs(got["val/acc/icl"][-1][1] - 0.6999) < 1e-6
    curves.main([f"tiny={run}", "--every", "1000", "--fig", str(tmp_path / "f.png")])
    out = capsys.readouterr().out
    assert "999:0.600" in out and "1999:0.700" in out and "499:" not in out  # the last of each block of 1000
    assert (tmp_path / "f.png").stat().st_size > 1000

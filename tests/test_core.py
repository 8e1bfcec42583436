"""Shared core helpers: seeds, the results format, figures, the report command."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from lit_icl.core.figures import aggregate, bar_figure, line_figure, mean_sd, select
from lit_icl.core.results import csv_columns, load_results, result_row, write_results
from lit_icl.core.seeding import derive_seed, make_generator
from lit_icl.report import experiment_fingerprint, label_runs
from lit_icl.report import main as report


def test_derived_seeds_are_stable_and_distinct() -> None:
    # A fixed value: seeds must not depend on the process (Python's str hash is salted per process).
    assert derive_seed(0, "train", 3) == derive_seed(0, "train", 3)
    assert len({derive_seed(0, s, i) for s in ("train", "val", "test") for i in range(100)}) == 300
    assert 0 <= derive_seed("x") < 2**63
    g1, g2 = make_generator(1, "val", 0), make_generator(1, "val", 0)
    assert g1.initial_seed() == g2.initial_seed()


def test_result_rows_are_tidy_and_checked() -> None:
    row = result_row("accuracy", torch.tensor(0.5), method="m", label_ratio=0.25)
    assert row == {"metric": "accuracy", "value": 0.5, "split": "test", "method": "m", "label_ratio": 0.25}
    assert isinstance(row["value"], float)
    with pytest.raises(ValueError, match="metric name"):
        result_row("", 1.0, method="m")
    with pytest.raises(ValueError, match="JSON scalars"):
        result_row("accuracy", 1.0, method="m", ratios=[0.1])
    assert csv_columns([{"metric": 1, "value": 1, "split": 1, "method": 1, "b": 1}, {"a": 2}]) == [
        "metric", "value", "split", "method", "b", "a"]


def test_results_files_round_trip(tmp_path) -> None:
    rows = [result_row("accuracy", 0.1 * i, method="m", label_ratio=r) for i, r in enumerate([0.1, 0.2])]
    rows.append(result_row("parameters", 11433, method="m"))
    fig = line_figure(rows, "label_ratio", metric="accuracy")
    write_results(tmp_path, rows, {"seeds": {"seed_everything": 3}}, {"acc": fig})
    loaded = load_results(tmp_path)
    assert loaded["rows"] == rows and loaded["meta"]["seeds"]["seed_everything"] == 3
    with open(tmp_path / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [float(r["value"]) for r in table] == [r["value"] for r in rows]
    assert table[-1]["label_ratio"] == ""  # the parameter count has no label ratio
    assert Image.open(tmp_path / "acc.png").format == "PNG"
    (tmp_path / "bad.json").write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="not a lit_icl results file"):
        load_results(tmp_path / "bad.json")


def test_aggregation_is_mean_and_sample_sd() -> None:
    values = [0.7, 0.8, 0.95]
    mean, sd, n = mean_sd(values)
    assert math.isclose(mean, statistics.mean(values)) and math.isclose(sd, statistics.stdev(values)) and n == 3
    assert mean_sd([0.4]) == (0.4, 0.0, 1)
    rows = [{"method": m, "x": x, "value": v} for m, x, v in [("a", 1, 1.0), ("a", 1, 3.0), ("b", 1, 5.0)]]
    stats = aggregate(rows, ["method", "x"])
    assert stats[("a", 1)] == (2.0, math.sqrt(2.0), 2) and stats[("b", 1)] == (5.0, 0.0, 1)
    assert select(rows, method=("a",), x=1) == rows[:2]


def test_figures_draw_one_line_per_method_with_sd_bands() -> None:
    rows = [result_row("acc", v, method=m, r=r) for m, r, v in
            [("a", 0.1, 0.5), ("a", 0.1, 0.7), ("a", 0.2, 0.8), ("b", 0.1, 0.4), ("b", 0.2, 0.6)]]
    fig = line_figure(rows, "r", metric="acc")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"a", "b"}
    assert list(lines["a"].get_ydata()) == pytest.approx([0.6, 0.8])
    assert len(ax.collections) == 1  # only "a" has two runs at a point, so only it gets a band
    bars = bar_figure(rows, "r", metric="acc")
    assert isinstance(bars, Figure) and len(bars.axes[0].patches) == 4
    with pytest.raises(ValueError, match="no rows"):
        line_figure(rows, "r", metric="mse")


def _fake_run(path, seed: int, name: str, accs: list[float], lr: float = 0.003) -> None:
    rows = [result_row("accuracy", a, method="E2E", label_ratio=r, n_labeled=round(100 * r))
            for r, a in zip([0.03, 0.25], accs)]
    rows.append(result_row("parameters", 11433, method="E2E"))
    config = {
        "seed_everything": seed,
        "model": {"class_path": "M", "init_args": {"lr": lr}},
        "data": {"class_path": "D", "init_args": {"data_seed": seed}},
        "trainer": {"max_epochs": 1, "logger": {"class_path": "TB", "init_args": {"name": name, "version": seed}}},
    }
    write_results(path, rows, {"config": config})


def test_report_averages_runs_that_differ_only_in_seed(tmp_path, capsys) -> None:
    _fake_run(tmp_path / "s0", 0, "exp", [0.70, 0.90])
    _fake_run(tmp_path / "s1", 1, "exp", [0.80, 0.92])
    _fake_run(tmp_path / "other", 0, "exp2", [0.5, 0.6], lr=0.1)
    runs = [load_results(tmp_path / p) for p in ("s0", "s1", "other")]
    assert experiment_fingerprint(runs[0]["meta"]) == experiment_fingerprint(runs[1]["meta"])
    assert experiment_fingerprint(runs[0]["meta"]) != experiment_fingerprint(runs[2]["meta"])
    assert label_runs(runs) == ["exp", "exp", "exp2"]
    out = tmp_path / "cmp.png"
    report([str(tmp_path / p) for p in ("s0", "s1", "other")] + ["--out", str(out)])
    table = capsys.readouterr().out.splitlines()
    assert table[2] == "| experiment | method | label_ratio=0.03 | label_ratio=0.25 |"
    sd = statistics.stdev([0.70, 0.80])
    assert table[4] == f"| exp | E2E | 0.750 ± {sd:.3f} | 0.910 ± {statistics.stdev([0.90, 0.92]):.3f} |"
    assert table[5] == "| exp2 | E2E | 0.500 | 0.600 |"  # n_labeled follows label_ratio: no column of its own
    assert "| exp | E2E | 11433 |" in table  # a count, identical over seeds
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        report([str(tmp_path / "missing")])


def test_report_pools_a_seed_coordinate_like_runs(tmp_path, capsys) -> None:
    """I2CL's rows carry ``seed``: the report's cells are mean ± sd over it (Table 1's "over 5 seeds"), and
    ``--x seed`` still gives one column per seed."""
    accs = {"i2cl": [0.70, 0.75, 0.80], "zero_shot": [0.77, 0.77, 0.77]}
    for s in range(3):
        rows = [result_row("accuracy", accs[m][s], method=m, task="sst2", seed=s) for m in accs]
        config = {"data": {"init_args": {"data_seed": s}}, "trainer": {"logger": {"init_args": {"name": f"s{s}"}}}}
        write_results(tmp_path / f"s{s}", rows, {"config": config})
    runs = [str(tmp_path / f"s{s}") for s in range(3)]
    report(runs + ["--metric", "accuracy"])
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "**accuracy** (n = 3 runs per cell)"
    assert table[2] == "| method | accuracy |"  # one task: no column coordinate
    assert table[4] == f"| i2cl | 0.750 ± {statistics.stdev(accs['i2cl']):.3f} |"
    assert table[5] == "| zero_shot | 0.770 ± 0.000 |"
    report(runs + ["--metric", "accuracy", "--x", "seed"])
    table = capsys.readouterr().out.splitlines()
    assert table[2] == "| method | seed=0 | seed=1 | seed=2 |"
    assert table[4] == "| i2cl | 0.700 | 0.750 | 0.800 |"

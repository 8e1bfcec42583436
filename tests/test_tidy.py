"""A grid's tidy table (experiments/tidy.py): what the drivers' reports read, the same from the run folders and from
the CSV, with no machine paths in it."""

from __future__ import annotations

import csv
import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.fixture(scope="module")
def tidy():
    sys.path.insert(0, str(EXPERIMENTS))
    return importlib.import_module("tidy")


def _run(folder: Path, config: dict, *, done: str | None = "81.5 s\ncpu 80.2 s\ncommit 0123abcd4567\n",
         results: dict | None = None, stopping: dict | None = None) -> None:
    folder.mkdir(parents=True)
    folder.joinpath("config.yaml").write_text(yaml.safe_dump(config))
    if done is not None:
        folder.joinpath("done").write_text(done)
    if results is not None:
        folder.joinpath("results.json").write_text(json.dumps(results))
    if stopping is not None:
        folder.joinpath("stopping.json").write_text(json.dumps(stopping))


def _config(seed: int, kernel: str, root: str) -> dict:
    return {"seed_everything": seed,
            "trainer": {"logger": {"init_args": {"save_dir": root, "version": f"s{seed}"}}, "max_steps": 400},
            "model": {"class_path": "M", "init_args": {"net": {"init_args": {"kernel": kernel, "width": 16}}}},
            "data": {"init_args": {"root": f"{root}/data", "train_manifolds": ["spiral"]}},
            "ckpt_path": f"{root}/m/s{seed}/checkpoints/last.ckpt"}


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    """Two fits and their tests, one test run by hand (no `done`), values of every JSON type."""
    root = tmp_path / "runs"
    where = str(tmp_path / "machine")
    stopping = {"monitor": "val/acc", "best_step": 100, "stopped_step": 600, "stopped_early": True, "best_score": 0.875}
    _run(root / "rbf" / "s0", _config(0, "rbf", where), stopping=stopping)
    _run(root / "linear" / "s1", _config(1, "linear", where), done="12.0 s\n")  # an old marker: no CPU, no commit
    rows = [{"metric": "accuracy", "value": 0.7250926494598389, "split": "test", "method": "EIG+ICL", "n_labeled": 3,
             "label_ratio": 0.03},
            {"metric": "accuracy", "value": float("nan"), "split": "test", "method": "class_prior", "n_labeled": 3},
            {"metric": "mnn", "value": 0.5, "split": "test", "method": "m", "embeddings": "model~transformer"},
            {"metric": "params", "value": 43754, "split": "test", "method": "m", "manifold": "3"},
            {"metric": "ok", "value": True, "split": "test", "method": "true"}]
    meta = {"config": {"seed_everything": 0}, "checkpoint": f"{where}/best.ckpt", "trained_steps": 100,
            "stopping": stopping}
    _run(root / "rbf" / "s0_test_manifolds", _config(0, "rbf", where), results={"meta": meta, "rows": rows})
    _run(root / "linear" / "s1_test_manifolds", _config(1, "linear", where), done=None,
         results={"meta": {"trained_steps": 400, "stopping": None}, "rows": rows[:1]})
    (root / "linear" / "s2").mkdir()  # started, not finished: no record
    return root


def test_folders_and_csv_give_the_same_records(tidy, grid, tmp_path) -> None:
    folders = tidy.load(grid)
    assert list(folders) == ["linear/s1", "linear/s1_test_manifolds", "rbf/s0", "rbf/s0_test_manifolds"]
    assert tidy.write(folders, tmp_path / "grid.csv") == 2 + 5 + (1 + 5 + 5) + 1
    back = tidy.load(tmp_path / "grid.csv")
    assert list(back) == list(folders)
    for run, record in folders.items():
        other = back[run]
        assert (other.wall, other.cpu, other.commit, other.stopping, other.seed) == (
            record.wall, record.cpu, record.commit, record.stopping, record.seed), run
        if record.results is None:
            assert other.results is None
            continue
        assert other.results["meta"] == record.results["meta"]
        for a, b in zip(other.results["rows"], record.results["rows"], strict=True):
            assert a.keys() == b.keys()
            for key in a:  # every value keeps its type: NaN, ints, booleans, strings that look like numbers
                assert type(a[key]) is type(b[key]) and (a[key] == b[key] or math.isnan(a[key])), (run, key)
    assert back["rbf/s0"].commit == "0123abcd4567" and back["linear/s1"].cpu is None
    assert back["linear/s1_test_manifolds"].wall is None  # run by hand: no cost recorded


def test_the_csv_says_what_varied_and_holds_no_machine_path(tidy, grid, tmp_path) -> None:
    tidy.write(tidy.load(grid), tmp_path / "grid.csv")
    text = (tmp_path / "grid.csv").read_text()
    assert str(tmp_path) not in text  # logger folders, data roots, checkpoints: where, not what
    with open(tmp_path / "grid.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:7] == list(tidy.RUN_COLUMNS)
    # The kernel varies between runs; the width and max_steps do not, so only the kernel is a column.
    assert [c for c in rows[0] if c.startswith("config.")] == ["config.model.net.kernel"]
    fit = [r for r in rows if r["run"] == "rbf/s0"]
    assert {r["metric"]: r["value"] for r in fit} == {
        "wall_s": "81.5", "stopping.monitor": "val/acc", "stopping.best_step": "100", "stopping.stopped_step": "600",
        "stopping.stopped_early": "true", "stopping.best_score": "0.875"}
    assert {(r["seed"], r["steps"], r["cpu_s"], r["config.model.net.kernel"]) for r in fit} == {("0", "600", "80.2", "rbf")}
    test = [r for r in rows if r["run"] == "rbf/s0_test_manifolds" and r["metric"] == "accuracy"]
    assert [(r["method"], r["n_labeled"], r["steps"]) for r in test] == [("EIG+ICL", "3", "100"), ("class_prior", "3", "100")]
    assert next(r for r in rows if r["metric"] == "params")["manifold"] == '"3"'  # a string, not the number 3


def test_a_csv_of_another_kind_is_refused_by_name(tidy, tmp_path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("metric,value\nacc,1\n")
    with pytest.raises(SystemExit, match="not a grid's tidy CSV: it has no column run"):
        tidy.load(path)
    with pytest.raises(SystemExit, match="no such results CSV"):
        tidy.load(tmp_path / "missing.csv")
    assert tidy.load(tmp_path / "no_grid_yet") == {}


def test_a_result_key_that_names_a_column_is_refused(tidy, tmp_path) -> None:
    _run(tmp_path / "m" / "s0_test", {}, results={"meta": {}, "rows": [{"metric": "a", "value": 1, "steps": 3}]})
    with pytest.raises(ValueError, match="key 'steps'"):
        tidy.rows(tidy.load(tmp_path))


def test_a_result_key_that_repeats_its_runs_column_is_that_column(tidy, tmp_path) -> None:
    _run(tmp_path / "a" / "s4_test", {"seed_everything": 4},
         results={"meta": {}, "rows": [{"metric": "acc", "value": 0.5, "seed": 4}]})
    assert [(r["seed"], r["metric"]) for r in tidy.rows(tidy.load(tmp_path))] == [(4, "wall_s"), (4, "acc")]
    _run(tmp_path / "b" / "s4_test", {"seed_everything": 4},
         results={"meta": {}, "rows": [{"metric": "acc", "value": 0.5, "seed": 5}]})
    with pytest.raises(ValueError, match="key 'seed'.*another value"):
        tidy.rows(tidy.load(tmp_path))


@pytest.mark.parametrize("keep, steps", [(None, list(range(0, 60, 5))), (3, [45, 50, 55])])
def test_logged_curves_a_report_names_come_back_from_the_csv(tidy, tmp_path, keep, steps) -> None:
    from torch.utils.tensorboard import SummaryWriter

    fit = tmp_path / "runs" / "m" / "s0"
    _run(fit, {"seed_everything": 0})
    writer = SummaryWriter(str(fit))
    for step in range(0, 60, 5):
        writer.add_scalar("val/acc", step / 100, step)
        writer.add_scalar("train/loss", 1.0, step)  # not asked for: not kept
    writer.close()
    records = tidy.load(tmp_path / "runs", {"val/acc": keep})
    assert records["m/s0"].scalars == {"val/acc": {s: pytest.approx(s / 100) for s in steps}}
    tidy.write(records, tmp_path / "grid.csv")
    back = tidy.load(tmp_path / "grid.csv")
    assert back["m/s0"].scalars == records["m/s0"].scalars
    assert back["m/s0"].wall == records["m/s0"].wall


def test_a_driver_refuses_to_train_into_a_csv_or_to_overwrite_the_csv_it_reads(tidy, tmp_path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("mmca_avmnist_table1", EXPERIMENTS / "mmca_avmnist_table1.py")
    driver = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = driver
    spec.loader.exec_module(driver)
    table = tmp_path / "grid.csv"
    for argv, problem in ((["fit", "--out", str(table)], "is a results CSV; `fit` needs a run folder"),
                          (["report", "--out", str(table), "--csv", str(table)], "is the file --out reads")):
        with pytest.raises(SystemExit) as stop:
            driver.parse_args(argv)
        assert stop.value.code == 2 and problem in capsys.readouterr().err
    assert not table.exists()

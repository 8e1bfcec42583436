"""The experiment drivers' shared job runner (experiments/runner.py): done markers with their cost and commit, the
cost summary of a grid, and a grid's tidy table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "runner.py"


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("runner", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    sys.path.insert(0, str(SCRIPT.parent))  # its `cost` reads grids through experiments/tidy.py beside it
    spec.loader.exec_module(module)
    return module


def test_done_marker_keeps_wall_and_cpu_seconds_and_reads_the_older_wall_only_marker(runner, tmp_path) -> None:
    runner.write_done(tmp_path, 12.34, 10.01)
    assert runner.read_done(tmp_path) == (12.3, 10.0)
    (tmp_path / "done").write_text("81.5 s\n")  # written before CPU time was recorded
    assert runner.read_done(tmp_path) == (81.5, None)


def test_a_subprocess_job_records_its_own_cpu_time(runner, tmp_path) -> None:
    # `python -m lit_icl fit --help` imports Lightning and exits 0: a real child process with real CPU time.
    job = runner.Job("help", ["fit", "--help"], tmp_path / "job")
    _, rc, wall = runner.run_job(job, threads=1, dry=False)
    assert rc == 0 and job.done
    recorded_wall, cpu = runner.read_done(job.folder)
    assert recorded_wall == pytest.approx(wall, abs=0.1)
    # One thread: the child cannot have used much more CPU than wall-clock time, and importing torch takes some.
    assert 0.05 < cpu < 2 * wall
    assert (job.folder / "fit.log").read_text().startswith("$ ")  # the command line heads the log


def test_a_failing_job_is_not_marked_done(runner, tmp_path) -> None:
    job = runner.Job("bad", ["fit", "--no-such-option"], tmp_path / "bad")
    _, rc, _ = runner.run_job(job, threads=1, dry=False)
    assert rc != 0 and not job.done


def _finished(folder: Path, wall: float, cpu: float | None, records: dict[str, str]) -> None:
    folder.mkdir(parents=True)
    (folder / "done").write_text(f"{wall} s\n" + ("" if cpu is None else f"cpu {cpu} s\n"))
    for name, text in records.items():
        (folder / name).write_text(text)


def test_cost_sums_finished_jobs_by_stage_and_counts_markers_without_cpu(runner, tmp_path) -> None:
    _finished(tmp_path / "a" / "s0", 3600, 3000, {})
    _finished(tmp_path / "a" / "s1", 1800, None, {})
    _finished(tmp_path / "a" / "s0_test_manifolds", 360, 300, {})
    (tmp_path / "b" / "s0").mkdir(parents=True)  # unfinished: no marker, not counted
    text = runner.cost([tmp_path])
    assert "| fit | 2 | 1.50 | 0.83 (1 without) |" in text
    assert "| test | 1 | 0.10 | 0.08 |" in text
    assert "| all | 3 | 1.60 | 0.92 (1 without) |" in text


def test_tidy_command_writes_a_grids_table_that_cost_reads_back(runner, tmp_path, capsys) -> None:
    src = tmp_path / "runs"
    results = json.dumps({"meta": {"trained_steps": 40}, "rows": [{"metric": "accuracy", "value": 0.9}]})
    _finished(src / "m" / "s0", 1800, 1500, {"config.yaml": "seed_everything: 0\n", "stopping.json": "{}"})
    _finished(src / "m" / "s0_test_manifolds", 360, 300, {"results.json": results})
    runner.main(["tidy", str(src), str(tmp_path / "grid.csv")])
    assert "3 rows of 2 runs written" in capsys.readouterr().out
    # The table alone gives the grid's cost, as the run folders do.
    assert runner.cost([tmp_path / "grid.csv"]) == runner.cost([src])
    for argv, problem in ((["tidy", str(tmp_path / "none"), str(tmp_path / "x.csv")], "no such folder"),
                          (["tidy", str(src), str(tmp_path / "x.txt")], "the tidy table is a .csv file"),
                          (["tidy", str(tmp_path / "m_empty"), str(tmp_path / "x.csv")], "no such folder")):
        with pytest.raises(SystemExit) as stop:
            runner.main(argv)
        assert stop.value.code == 2 and problem in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_cost_command_refuses_a_missing_folder(runner, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        runner.main(["cost", str(tmp_path / "nowhere")])
    assert stop.value.code == 2
    assert "no such run folder or results CSV" in capsys.readouterr().err


@pytest.mark.parametrize("value, problem", [("0", "0 must be at least 1"), ("-5", "-5 must be at least 1"),
                                            ("1.5", "'1.5' is not an integer"), ("many", "'many' is not an integer")])
def test_step_floor_refuses_what_is_not_a_positive_count_by_name(runner, value, problem, capsys) -> None:
    # Every convergence driver (IC-SSL tables, Swiss-roll ablation, Fig. 3 sweep) takes --min-steps from here.
    import argparse

    parser = argparse.ArgumentParser()
    runner.add_convergence_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--patience", "5", "--min-steps", value])
    assert f"--min-steps: {problem}" in capsys.readouterr().err
    assert parser.parse_args(["--patience", "5", "--min-steps", "1500"]).min_steps == 1500


def test_best_checkpoint_is_the_highest_step_by_number_not_by_name(runner, tmp_path) -> None:
    assert runner.best_checkpoint(tmp_path) is None  # no checkpoints folder yet
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "last.ckpt").touch()
    assert runner.best_checkpoint(tmp_path) is None  # a last checkpoint is not a best one
    # A run resumed in a copied folder keeps the earlier sitting's best beside its own; as text, epoch=72 would win.
    for name in ("best-epoch=72-step=15914.ckpt", "best-epoch=259-step=56680.ckpt"):
        (ckpts / name).touch()
    assert runner.best_checkpoint(tmp_path).name == "best-epoch=259-step=56680.ckpt"

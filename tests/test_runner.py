"""The experiment drivers' shared job runner (experiments/runner.py): done markers with their cost and commit, the
cost summary of a grid, and a grid's tidy table."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
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


@pytest.fixture
def quick_cli(runner, tmp_path, monkeypatch):
    """Jobs run a stand-in for ``python -m lit_icl`` that exits at once (0 for ``--help``, 2 otherwise), so a test
    of the runner's bookkeeping does not spend seconds importing Lightning per job. One test runs the real CLI."""
    folder = tmp_path / "quick_cli"
    folder.mkdir()
    (folder / "quick_lit_icl.py").write_text('import sys\nsys.exit(0 if "--help" in sys.argv else 2)\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr(runner, "CLI_MODULE", "quick_lit_icl")


def test_done_marker_keeps_wall_and_cpu_seconds_and_reads_the_older_wall_only_marker(runner, tmp_path) -> None:
    runner.write_done(tmp_path, 12.34, 10.01)
    assert runner.read_done(tmp_path) == (12.3, 10.0)
    (tmp_path / "done").write_text("81.5 s\n")  # written before CPU time was recorded
    assert runner.read_done(tmp_path) == (81.5, None)


def test_a_subprocess_job_records_its_own_cpu_time(runner, tmp_path, monkeypatch) -> None:
    # A stand-in CLI that computes for 0.3 s and exits 0: a real child process with real CPU time.
    (tmp_path / "busy_lit_icl.py").write_text("import time\nend = time.process_time() + 0.3\n"
                                              "while time.process_time() < end:\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr(runner, "CLI_MODULE", "busy_lit_icl")
    job = runner.Job("help", ["fit", "--help"], tmp_path / "job")
    _, rc, wall = runner.run_job(job, threads=1, dry=False)
    assert rc == 0 and job.done
    recorded_wall, cpu = runner.read_done(job.folder)
    assert recorded_wall == pytest.approx(wall, abs=0.1)
    # One thread: the child cannot have used much more CPU than wall-clock time, and importing torch takes some.
    assert 0.3 <= cpu < 2 * wall
    assert (job.folder / "fit.log").read_text().startswith("$ ")  # the command line heads the log


def test_a_failing_job_is_not_marked_done(runner, quick_cli, tmp_path) -> None:
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
    assert capsys.readouterr().err.strip().splitlines() == [
        f"runner.py cost: error: no such run folder or results CSV: {tmp_path / 'nowhere'}"]  # one line, no usage
    with pytest.raises(SystemExit) as stop:
        runner.main(["tidy", str(tmp_path), str(tmp_path / "grid.csv")])  # an empty (or not yet finished) grid
    assert stop.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"runner.py tidy: error: no finished run (a folder with a `done` marker) under {tmp_path}"]


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


def _driver_parser(runner):
    import argparse

    parser = argparse.ArgumentParser(prog="driver")
    runner.add_stage_arg(parser)
    parser.add_argument("--out", type=Path)
    runner.add_job_args(parser)
    return parser


def _grid(runner, out: Path):
    """A two-job grid of ``python -m <the runner's CLI>`` calls (``--help``: a real process)."""
    fit = runner.Job("fit a s0", ["fit", "--help"], out / "a" / "s0")
    test = runner.Job("test a s0", ["test", "--help"], out / "a" / "s0_test", after=[fit.folder])
    return (lambda args: [fit]), (lambda args: [test] if fit.done else [])


def test_stage_all_fits_then_tests_then_reports_and_records_each_jobs_state(runner, quick_cli, tmp_path, capsys) -> None:
    parser = _driver_parser(runner)
    argv = ["all", "--out", str(tmp_path / "grid"), "--jobs", "1"]
    args = runner.parse_driver_args(parser, argv, "experiments/driver.py")
    args.out = args.out.resolve()
    fits, tests = _grid(runner, args.out)
    with pytest.raises(SystemExit) as stop:
        runner.drive(args, fits, tests, lambda a: "THE REPORT", lambda argv: runner.parse_driver_args(
            parser, argv, "experiments/driver.py"))
    assert stop.value.code == 0
    out = capsys.readouterr().out
    # The tests were built after the fit had finished (a test may read its fit's checkpoints), then the report.
    assert out.index("fit a s0: ok") < out.index("test a s0: ok") < out.index("THE REPORT")
    for folder in (args.out / "a" / "s0", args.out / "a" / "s0_test"):
        state = runner.read_state(folder)
        assert state["state"] == "done" and state["rc"] == 0 and state["executor"] == "local"
        assert (folder / "done").is_file()
    assert json.loads((args.out / "grid.json").read_text())["argv"] == argv


def test_a_report_with_nothing_to_show_still_lists_the_failed_jobs(runner, quick_cli, tmp_path, capsys) -> None:
    """Every fit failed, so the report has no rows and stops; the failed jobs and the rerun command still come out.
    ``all`` then exits 1, as a stage whose jobs did not finish (it exited with the report's refusal)."""
    parser = _driver_parser(runner)
    out = tmp_path / "grid"
    fit = runner.Job("fit a s0", ["fit", "--no-such-option"], out.resolve() / "a" / "s0")  # the stand-in exits 2
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")

    def empty_report(args):
        raise SystemExit("no tested runs under the grid")

    for run in (["all"], ["report"]):
        args = parse([*run, "--out", str(out), "--jobs", "1"])
        args.out = args.out.resolve()
        with pytest.raises(SystemExit) as stop:
            runner.drive(args, lambda a: [fit], lambda a: [], empty_report, parse)
        # all: status 1 (its jobs did not finish; 2 would read as a refusal), with the report's line
        assert stop.value.code == (1 if run == ["all"] else "no tested runs under the grid")
        err = capsys.readouterr().err
        assert "fit a s0" in err and "failed" in err, err
        assert run == ["report"] or "no tested runs under the grid" in err


def test_a_report_whose_options_differ_from_the_grids_says_so_with_both(runner, tmp_path, capsys) -> None:
    """``report`` reads the runs with its own options (they name what the tables hold); run bare on a 1-seed, 6-step
    grid it used to print "seeds [0, 1, 2] ... 300 steps" without a word. Now a note on stderr gives both settings;
    a report with the grid's options, or on a folder without ``grid.json``, prints none."""
    parser = _driver_parser(runner)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out = tmp_path / "grid"
    runner.record_grid(parse(["--out", str(out), "--seeds", "4", "--steps", "6", "--jobs", "3", "fit"]))
    seen = []

    def report(args):
        seen.append((args.seeds, args.steps))
        return "TABLES"

    for argv, note in ((["report", "--out", str(out)],
                        (f"note: this report takes --seeds 0 1 2 --steps 300; the grid's own command "
                        f"({out / 'grid.json'}) took --seeds 4 --steps 6; give report the grid's options to report the grid")),
                       (["report", "--out", str(out), "--seeds", "4", "--steps", "6"], None)):
        runner.drive(parse(argv), lambda a: [], lambda a: [], report, parse)
        printed, err = capsys.readouterr()
        assert printed == "TABLES\n" and seen.pop() == tuple(parse(argv).__dict__[k] for k in ("seeds", "steps"))
        assert (note in err) if note else ("note:" not in err), err  # --jobs 3 is how it ran, not what: no note
    (out / "grid.json").unlink()
    runner.drive(parse(["report", "--out", str(out)]), lambda a: [], lambda a: [], report, parse)
    assert "note:" not in capsys.readouterr().err


def test_a_test_stage_that_would_test_other_fits_than_the_grids_says_so(runner, quick_cli, tmp_path, capsys) -> None:
    """``fit --seeds 4``, then a bare ``test``: its tests wait for fits of seeds 0-2 that never ran ("run fit
    first"), which said nothing of why. Now a note names the settings; a test whose fits are the grid's has none."""
    parser = _driver_parser(runner)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--test-episodes", type=int, default=512)
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out = tmp_path / "grid"
    fits = lambda a: [runner.Job(f"fit s{seed}", ["fit", "--help"], a.out / f"s{seed}") for seed in a.seeds]
    runner.record_grid(parse(["fit", "--out", str(out), "--seeds", "4"]))
    for argv, note in ((["test", "--out", str(out)], "note: this test takes --seeds 0 1 2; the grid's own command "),
                       (["test", "--out", str(out), "--seeds", "4", "--test-episodes", "16"], None)):
        with pytest.raises(SystemExit):
            runner.drive(parse(argv), fits, lambda a: [], lambda a: "", parse)
        err = capsys.readouterr().err
        assert (note in err and "took --seeds 4; give test the grid's options" in err) if note else "note:" not in err


def test_a_grid_whose_command_no_longer_parses_is_still_reported(runner, tmp_path, capsys) -> None:
    """The grid's overlay was moved since it ran (or the report runs from another folder): the report is printed
    and the unfinished jobs cannot be listed, in one line saying why, instead of the report failing."""
    parser = _driver_parser(runner)
    parser.add_argument("--overlay", type=runner.config_file, nargs="+", default=[])
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out, overlay = tmp_path / "grid", tmp_path / "gpu.yaml"
    overlay.write_text("trainer:\n  accelerator: cpu\n")
    runner.record_grid(parse(["fit", "--out", str(out), "--overlay", str(overlay)]))
    overlay.unlink()
    runner.drive(parse(["report", "--out", str(out)]), lambda a: [], lambda a: [], lambda a: "TABLES", parse)
    printed, err = capsys.readouterr()
    assert printed == "TABLES\n"
    assert err.strip() == (f"the unfinished jobs of the grid cannot be listed: its command in {out / 'grid.json'} "
                           f"no longer parses (driver: error: argument --overlay: no such config file: {overlay} (an "
                           "overlay sits beside its base config, in configs/<paper>/<experiment>/))")


def test_a_test_stage_adds_its_options_to_the_grids_record_after_the_fits(runner, tmp_path) -> None:
    """Fit and test run as separate stages (as docs/icssl.md's converged grid does): the record keeps the fit's
    settings, which a later report and rerun need, with the test's options after them; a second test does not pile up."""
    parser = _driver_parser(runner)
    parser.add_argument("--steps", type=int, default=300)
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out = tmp_path / "grid"
    fit = ["fit", "--out", str(out), "--steps", "4000", "--only", "a"]
    runner.record_grid(parse(fit))
    for test in (["test", "--out", str(out), "--jobs", "3"], ["test", "--out", str(out), "--only", "b"]):
        runner.record_grid(parse(test))
        record = json.loads((out / "grid.json").read_text())
        assert record["argv"] == ["test", *fit[1:], *test[1:]] and record["fit_argv"] == fit
        merged = parse(record["argv"])
        assert merged.stage == "test" and merged.steps == 4000
    assert merged.only == ["b"] and runner.rerun_command(out).endswith(
        f"driver.py all --out {out} --steps 4000 --only a --out {out} --only b")
    runner.record_grid(parse(["fit", "--out", str(out), "--steps", "50"]))  # a new fit starts the record again
    assert json.loads((out / "grid.json").read_text())["argv"] == ["fit", "--out", str(out), "--steps", "50"]


def test_the_rerun_command_of_a_moved_grid_names_its_folder_now(runner, tmp_path) -> None:
    """A grid folder moved (or copied) after it ran: the report's rerun command named the old folder, so the rerun
    trained the missing jobs there (or into a folder that no longer exists), not in the grid being reported."""
    parser = _driver_parser(runner)
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    old, new = tmp_path / "old", tmp_path / "new"
    runner.record_grid(parse(["fit", "--out", str(old), "--jobs", "2"]))
    old.rename(new)
    assert runner.rerun_command(new).endswith(f"driver.py all --out {new} --jobs 2")
    runner.record_grid(parse(["fit", "--out", str(new)]))  # one that has not moved keeps its command as typed
    assert runner.rerun_command(new).endswith(f"driver.py all --out {new}")


def test_options_a_driver_passes_through_to_every_run_stay_after_the_double_dash(runner) -> None:
    """CoQE's driver passes what follows ``--`` to every run: a test stage's own options go before it, not after."""
    merged = runner._test_after_fit(["all", "--seeds", "0", "--", "--trainer.max_steps", "2"],
                                    ["test", "--out", "x", "--csv", "y", "--", "--data.init_args.test_sequences", "16"])
    assert merged == ["test", "--seeds", "0", "--out", "x", "--csv", "y", "--", "--trainer.max_steps", "2",
                      "--data.init_args.test_sequences", "16"]
    assert runner._test_after_fit(["fit", "--seeds", "0"], ["test", "--jobs", "2"]) == ["test", "--seeds", "0", "--jobs",
                                                                                        "2"]


def test_report_names_each_unfinished_job_with_its_reason_and_the_command_that_reruns_the_grid(runner, tmp_path) -> None:
    import argparse

    out = tmp_path / "grid"
    jobs = [runner.Job(f"fit {n}", ["fit"], out / n) for n in ("done", "failed", "killed", "cancelled", "never")]
    test = runner.Job("test never", ["test"], out / "never_test", after=[out / "never"])
    jobs[0].folder.mkdir(parents=True)
    runner.write_done(jobs[0].folder, 1.0, 1.0)
    runner.write_state(jobs[1].folder, "running", executor="local", job_id=None)
    runner.write_state(jobs[1].folder, "failed", rc=1)
    runner.write_state(jobs[2].folder, "running", executor="slurm", job_id="41_2")  # SIGKILL: no exit recorded
    runner.write_state(jobs[3].folder, "submitted", executor="slurm", job_id="42_0")
    args = argparse.Namespace(out=out, script=Path("experiments/driver.py").resolve(),
                              argv=["fit", "--seeds", "0", "1", "--executor", "slurm"])
    runner.record_grid(args)
    lines = runner.unfinished([*jobs, test], args)
    assert lines[0] == "5 of 6 jobs did not finish:"
    assert f"- fit failed: failed with exit code 1 (local); see {out / 'failed' / 'fit.log'}" in lines
    assert any(line.startswith("- fit killed: started but did not finish (SLURM job 41_2;") for line in lines)
    assert any(line.startswith("- fit cancelled: submitted but never started (SLURM job 42_0") for line in lines)
    assert "- fit never: not run" in lines
    assert f"- test never: not run (its fit {out / 'never'} has not finished)" in lines
    # The grid's own command with stage `all`: finished jobs are skipped, interrupted fits resume.
    assert lines[-1].endswith("python experiments/driver.py all --seeds 0 1 --executor slurm")
    assert runner.unfinished(jobs[:1], args) == []


def test_a_slurm_task_runs_the_job_its_folder_holds_and_refuses_one_whose_fit_has_not_finished(runner, quick_cli, tmp_path, capsys) -> None:
    fit = runner.Job("fit a", ["fit", "--help"], tmp_path / "a")
    test = runner.Job("test a", ["test", "--help"], tmp_path / "a_test", after=[fit.folder])
    test.write_spec(threads=3)
    assert runner.Job.read_spec(test.folder) == (test, 3)
    with pytest.raises(SystemExit) as stop:
        runner.main(["run-job", str(test.folder)])
    assert stop.value.code == 3 and f"its fit {fit.folder} has not finished" in capsys.readouterr().err
    assert runner.read_state(test.folder)["state"] == "failed" and not test.done
    fit.write_spec(threads=1)
    with pytest.raises(SystemExit) as stop:
        runner.main(["run-job", str(fit.folder)])
    assert stop.value.code == 0 and fit.done and runner.read_state(fit.folder)["state"] == "done"


@pytest.mark.parametrize("argv, problem", [
    (["--sbatch", "=x"], "--sbatch '=x': give each option as KEY=VALUE without dashes, e.g. account=myproject"),
    (["--time-min", "0"], "--time-min 0 must be positive"),
    (["--gpus-per-job", "-1"], "--gpus-per-job -1 must be 0 or more"),  # was "must be positive", but 0 is fine
    (["--max-requeues", "-1"], "--max-requeues -1 must be 0 or more"),
    (["--cpus-per-job", "0"], "--cpus-per-job 0 must be positive"),
    (["--poll-s", "0"], "--poll-s 0.0: give the seconds between looks at the queue, more than 0 (default 10)"),
])
def test_a_slurm_grid_that_cannot_run_is_refused_in_one_line(runner, tmp_path, monkeypatch, capsys, argv, problem) -> None:
    import shutil

    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")  # as if SLURM were installed
    monkeypatch.setitem(sys.modules, "submitit", sys.modules["runner"])  # any module: as if submitit were installed
    parser = _driver_parser(runner)
    with pytest.raises(SystemExit) as stop:
        runner.parse_driver_args(parser, ["fit", "--executor", "slurm", *argv], "driver.py").check_executor()
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1] == f"driver: error: {problem}"


def test_the_slurm_executor_names_what_it_needs_when_it_is_missing(runner, monkeypatch, capsys) -> None:
    import shutil

    parser = _driver_parser(runner)
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    with pytest.raises(SystemExit) as stop:
        runner.parse_driver_args(parser, ["fit", "--executor", "slurm"], "driver.py").check_executor()
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("--executor slurm needs submitit: pip install -e '.[cluster]'")
    monkeypatch.setitem(sys.modules, "submitit", sys.modules["runner"])  # any module: submitit "installed"
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    with pytest.raises(SystemExit):
        runner.parse_driver_args(parser, ["fit", "--executor", "slurm"], "driver.py").check_executor()
    assert "scripts/slurm_local.sh start runs one" in capsys.readouterr().err
    # The local executor needs neither, nor does reading a grid that ran on SLURM.
    assert runner.parse_driver_args(parser, ["fit"], "driver.py").check_executor() is None
    assert runner.parse_driver_args(parser, ["report", "--executor", "slurm"], "driver.py").executor == "slurm"


def test_every_job_of_a_grid_shares_a_slurm_name_of_its_own(runner) -> None:
    import argparse

    from cluster import grid_name

    def name(out: str) -> str:
        return grid_name(argparse.Namespace(out=Path(out), script=Path("experiments/mmca_avmnist_table1.py")))

    assert name("/runs/a") == name("/runs/a") != name("/runs/b")
    assert name("/runs/a").startswith("lit_icl.mmca_avmnist_table1.")


def test_the_sbatch_options_of_a_grid_follow_its_sizing_flags(runner, tmp_path, monkeypatch) -> None:
    from cluster import grid_name, sbatch_options

    monkeypatch.setitem(sys.modules, "submitit", sys.modules["runner"])  # as if submitit were installed
    monkeypatch.setattr("shutil.which", lambda tool: f"/usr/bin/{tool}")
    args = runner.parse_driver_args(_driver_parser(runner), [
        "fit", "--out", str(tmp_path), "--executor", "slurm", "--threads", "4", "--partition", "gpu",
        "--gpus-per-job", "1", "--mem-gb", "1.5", "--time-min", "90", "--sbatch", "account=lab", "exclusive"],
        "experiments/driver.py")
    args.check_executor()
    assert sbatch_options(args) == [f"--job-name={grid_name(args)}", "--time=90", "--cpus-per-task=4",
                                    "--partition=gpu", "--gpus-per-node=1", "--mem=1536MB", "--account=lab",
                                    "--exclusive"]


def test_a_grids_slurm_tasks_share_a_compile_cache_in_its_folder_unless_one_is_set(runner, tmp_path, monkeypatch) -> None:
    import argparse

    from cluster import RunJob, compile_cache_env

    env = compile_cache_env(argparse.Namespace(out=tmp_path / "grid"))
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str((tmp_path / "grid" / "compile_cache").resolve())}
    seen = tmp_path / "seen"
    report = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'unset'))"
    task = RunJob([sys.executable, "-c", report], cwd=str(tmp_path), env=env)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert task(str(seen)) == 0
    assert seen.read_text() == env["TORCHINDUCTOR_CACHE_DIR"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the submitting shell's own choice
    assert task(str(seen)) == 0
    assert seen.read_text() == str(tmp_path / "mine")


_PREEMPTED_CLI = '''import sys, time
from pathlib import Path
end = time.process_time() + 0.2  # each sitting computes for 0.2 s
while time.process_time() < end:
    pass
folder = Path(sys.argv[-1]) if "--ckpt_path" not in sys.argv else Path(sys.argv[-3])
if sys.argv[-2:] == ["--ckpt_path", "last"]:  # resumed: finishes
    (folder / "resumed").write_text("")
    sys.exit(0)
(folder / "checkpoints").mkdir(parents=True, exist_ok=True)
(folder / "checkpoints" / "last.ckpt").write_text("step 4")
sys.exit(143)  # the CLI's status after SIGTERM, having saved last.ckpt
'''


def test_a_fit_that_exits_143_is_not_marked_done_and_its_rerun_resumes_it(runner, tmp_path, monkeypatch) -> None:
    """The runner's side of a preemption (the CLI's side, status 143 with ``last.ckpt`` at the step reached, is in
    ``tests/test_reproducibility.py``; both together in the slow test below): the job is not done, its state says
    failed, the grid's rerun resumes it with ``--ckpt_path last``, and its ``done`` marker counts both sittings."""
    (tmp_path / "preempted_lit_icl.py").write_text(_PREEMPTED_CLI)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr(runner, "CLI_MODULE", "preempted_lit_icl")
    folder = tmp_path / "grid" / "a" / "s0"
    job = runner.Job("fit a s0", ["fit", str(folder)], folder)
    _, rc, _ = runner.run_job(job, threads=1, dry=False)
    assert rc == 143 and not job.done
    assert json.loads((job.folder / "job_state.json").read_text())["state"] == "failed"
    first = runner.read_state(job.folder)["earlier_cpu_s"]
    assert first >= 0.2
    _, rc, _ = runner.run_job(job, threads=1, dry=False)
    assert rc == 0 and job.done and (folder / "resumed").is_file()
    assert (job.folder / "fit.log").read_text().split("$ ")[2].splitlines()[0].endswith("--ckpt_path last")
    # The done marker counts both sittings, so `cost` gives what the whole fit took.
    assert runner.read_done(job.folder)[1] >= first + 0.2


@pytest.mark.slow  # a real CLI fit stopped by SIGTERM and rerun: 16-18 s; its two sides run in the default suite
def test_a_fit_stopped_by_sigterm_is_not_marked_done_and_its_rerun_resumes_from_where_it_stopped(
        runner, tmp_path, monkeypatch) -> None:
    """Lightning's own SIGTERM exit has status 0, which made the runner mark a preempted fit as done; the CLI's is
    143 and leaves ``last.ckpt`` at the step reached, so a rerun of the grid resumes the fit from there."""
    from icssl.helpers import tiny_args

    tests = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tests), os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "grid"
    term = '[{"class_path": "subprocess_callbacks.SignalAtStep", "init_args": ' \
           f'{{"step": 4, "rank": 0, "path": "{tmp_path / "ends.txt"}"}}}}]'
    argv = ["fit", *tiny_args(tmp_path, "--trainer.callbacks", term), *runner.logger_args(out, "a", "s0")]
    job = runner.Job("fit a s0", argv, out / "a" / "s0")
    _, rc, _ = runner.run_job(job, threads=1, dry=False)
    assert rc == 143 and not job.done
    assert json.loads((job.folder / "job_state.json").read_text())["state"] == "failed"
    import torch

    last = job.folder / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4  # not 3, the epoch's end
    _, rc, _ = runner.run_job(job, threads=1, dry=False)
    assert rc == 0 and job.done
    log = (job.folder / "fit.log").read_text()
    assert "--ckpt_path last" in log.split("$ ")[2].splitlines()[0]
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 6


def test_a_dry_run_prints_each_command_on_a_line_of_its_own_in_order_and_writes_nothing(runner, tmp_path,
                                                                                        capsys) -> None:
    import argparse

    jobs = [runner.Job(f"fit {i}", ["fit", "--seed_everything", str(i)], tmp_path / f"s{i}") for i in range(12)]
    args = argparse.Namespace(jobs=4, threads=1, dry_run=True)
    assert runner.run_all(jobs, args, "fit") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "12 jobs, 0 done, 12 to run (4 at a time)"
    assert [line.split()[-1] for line in lines[1:]] == [str(i) for i in range(12)]
    assert all(line.count(" -m lit_icl fit ") == 1 for line in lines[1:])
    assert not any(tmp_path.iterdir())


_SLOW_CLI = '''import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[-1])
def stop(signum, frame):  # as the CLI does: 143 after SIGTERM, 130 after Ctrl-C
    (folder / f"got_{signal.Signals(signum).name.lower()}").write_text(str(os.getpid()))
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
(folder / "started").write_text(str(os.getpid()))
time.sleep(60)
'''

_DRIVER = '''import argparse, importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("runner", sys.argv[1])
runner = importlib.util.module_from_spec(spec)
sys.modules["runner"] = runner
spec.loader.exec_module(runner)
runner.CLI_MODULE = "slow_lit_icl"
out = Path(sys.argv[2])
jobs = [runner.Job(f"fit {i}", ["fit", str(out / f"s{i}")], out / f"s{i}") for i in range(3)]
runner.run_all(jobs, argparse.Namespace(jobs=2, threads=1, dry_run=False), "fit")
'''


_TEST_DRIVER = '''import argparse, importlib.util, os, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("runner", sys.argv[1])
runner = importlib.util.module_from_spec(spec)
sys.modules["runner"] = runner
spec.loader.exec_module(runner)

def slow_test(job, threads):  # a test job in a forked worker that runs for a minute
    job.folder.mkdir(parents=True, exist_ok=True)
    runner.write_state(job.folder, "running", executor="local", job_id=None)
    (job.folder / "started").write_text(str(os.getpid()))
    time.sleep(60)
    return job, 0, 60.0

runner.run_job_in_process = slow_test
import types
sys.modules["lit_icl.cli"] = types.ModuleType("lit_icl.cli")  # the stand-in tests need none of its seconds of imports
out = Path(sys.argv[2])
jobs = [runner.Job(f"test {i}", ["test"], out / f"t{i}") for i in range(3)]
runner.run_all(jobs, argparse.Namespace(jobs=2, threads=1, dry_run=False), "test")
'''


#: How a driver is stopped: SIGTERM to it alone (a cluster's preemption, ``kill``), or Ctrl-C at its terminal,
#: which sends SIGINT to its whole process group, the jobs it runs included.
STOPS = {"sigterm": (signal.SIGTERM, "SIGTERM"), "ctrl_c": (signal.SIGINT, "Ctrl-C")}


def _stop_once_started(tmp_path: Path, driver_text: str, started: list[Path], stop: str,
                       env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``driver_text`` as a driver script on a grid under ``tmp_path / "grid"``, stop it as ``stop`` (a key of
    :data:`STOPS`) says once every file in ``started`` exists (its jobs are running), and return its exit status,
    stdout and stderr."""
    (tmp_path / "driver.py").write_text(driver_text)
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(SCRIPT), str(tmp_path / "grid")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # a process group of its own, as a terminal gives a command
    return _stopped_when_started(driver, started, stop)


def _stopped_when_started(driver: subprocess.Popen, started: list[Path], stop: str) -> tuple[int, str, str]:
    """Stop ``driver`` as ``stop`` says once every file in ``started`` exists; its exit status, stdout and stderr
    (``subprocess.TimeoutExpired`` if it has not ended 30 s later)."""
    deadline = time.monotonic() + 60
    while not all(path.is_file() for path in started):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.05)
    if stop == "ctrl_c":
        os.killpg(driver.pid, signal.SIGINT)
    else:
        driver.send_signal(signal.SIGTERM)
    printed, err = driver.communicate(timeout=30)
    return driver.returncode, printed, err


def _assert_gone(pid: int) -> None:
    """Fail unless process ``pid`` ends within 10 s (a worker may take a moment to be reaped by init)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"worker {pid} outlived the driver"
        time.sleep(0.05)


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stopped_driver_stops_the_tests_its_workers_run_and_starts_no_more(tmp_path, stop: str) -> None:
    """In the ``test`` stage the jobs run in forked workers. Stopped by SIGTERM or Ctrl-C, the driver stops them too
    (a test keeps nothing worth saving), records them as failed and exits 143 (130); before, they ran on as orphans
    after SIGTERM, beside the tests a rerun started in the same folders, and Ctrl-C printed a traceback per worker."""
    signum, name = STOPS[stop]
    out = tmp_path / "grid"
    rc, _, err = _stop_once_started(tmp_path, _TEST_DRIVER, [out / f"t{i}" / "started" for i in range(2)], stop)
    assert rc == 128 + signum, err
    assert f"stopped by {name}: the running tests were stopped" in err
    assert "Traceback" not in err
    for i in range(2):
        _assert_gone(int((out / f"t{i}" / "started").read_text()))
        assert json.loads((out / f"t{i}" / "job_state.json").read_text())["rc"] == 128 + signum
    assert not (out / "t2").exists()  # the third test never started


_CLI_HANDLER_TEST_DRIVER = _TEST_DRIVER.replace('''def slow_test(job, threads):  # a test job in a forked worker that runs for a minute
    job.folder.mkdir(parents=True, exist_ok=True)
    runner.write_state(job.folder, "running", executor="local", job_id=None)
    (job.folder / "started").write_text(str(os.getpid()))
    time.sleep(60)
    return job, 0, 60.0
''', '''import signal

def slow_test(job, threads):
    """A test job as the CLI runs it in a worker: Lightning's signal connector replaces the SIGTERM handler for the
    test's length, calling the one it replaced unless that is SIG_DFL (``chain``: sys.argv[3]); SIGTERM stops the
    test, which ends with the CLI's status 143; the handler found is put back at the end."""
    job.folder.mkdir(parents=True, exist_ok=True)
    runner.write_state(job.folder, "running", executor="local", job_id=None)
    stopped = []
    found = signal.getsignal(signal.SIGTERM)
    def lightnings(signum, frame):
        stopped.append(signum)
        if sys.argv[3] == "chain" and callable(found):
            found(signum, frame)
    signal.signal(signal.SIGTERM, lightnings)
    try:
        (job.folder / "started").write_text(str(os.getpid()))
        end = time.monotonic() + 60
        while not stopped and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, found)
    return job, 143 if stopped else 0, 1.0
''')


@pytest.mark.parametrize("handler", ["chain", "own"])
def test_a_stopped_driver_ends_workers_whose_test_installed_its_own_sigterm_handler(tmp_path, handler: str) -> None:
    """The CLI a worker runs in-process installs its own SIGTERM handler for the length of a test (Lightning's
    signal connector), so ``Pool.terminate()``'s SIGTERM stopped the test but not the worker, which waited forever
    for the pool's task queue, and the driver forever for it. Now the worker ends whether the CLI's handler calls the
    worker's (Lightning's does) or only stops the test with status 143; the driver exits 143 and a rerun finds the
    tests not done."""
    out = tmp_path / "grid"
    (tmp_path / "driver.py").write_text(_CLI_HANDLER_TEST_DRIVER)
    assert _CLI_HANDLER_TEST_DRIVER != _TEST_DRIVER
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(SCRIPT), str(out), handler],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        rc, _, err = _stopped_when_started(driver, [out / f"t{i}" / "started" for i in range(2)], "sigterm")
    finally:  # a driver that hangs, and its workers, must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert rc == 143, err
    assert "stopped by SIGTERM: the running tests were stopped" in err
    for i in range(2):
        _assert_gone(int((out / f"t{i}" / "started").read_text()))
        assert not (out / f"t{i}" / "done").exists()
        assert json.loads((out / f"t{i}" / "job_state.json").read_text())["state"] == "failed"


_TESTING_CALLBACK = '''import os, time
from pathlib import Path
from lightning.pytorch import Callback

class Testing(Callback):
    """Says the test is running (the worker's pid in ``path``) and slows it down, so it is stopped inside its loop."""
    def __init__(self, path: str):
        self.path = path
    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        Path(self.path).write_text(str(os.getpid()))
        time.sleep(0.2)
'''

_REAL_TEST_DRIVER = '''import argparse, importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("runner", sys.argv[1])
runner = importlib.util.module_from_spec(spec)
sys.modules["runner"] = runner
spec.loader.exec_module(runner)
out = Path(sys.argv[2])
argv = json.loads(sys.argv[3])
jobs = [runner.Job(f"test {i}", [*argv, "--trainer.callbacks", json.dumps([{"class_path": "testing_callback.Testing",
        "init_args": {"path": str(out / f"t{i}" / "testing")}}]), *runner.logger_args(out, f"t{i}", "v")], out / f"t{i}")
        for i in range(2)]
runner.run_all(jobs, argparse.Namespace(jobs=1, threads=1, dry_run=False), "test")
'''


@pytest.mark.slow  # the real CLI in a worker, stopped inside Lightning's test loop: about 30 s
def test_a_driver_stopped_while_the_real_cli_tests_in_its_worker_exits_and_ends_the_worker(tmp_path) -> None:
    """The tester's hang with the real CLI: Lightning's SIGTERM handler, installed for the test, took the SIGTERM
    of ``Pool.terminate()``; the test stopped (143), the worker did not, and the driver waited for it forever."""
    from icssl.helpers import tiny_args

    (tmp_path / "testing_callback.py").write_text(_TESTING_CALLBACK)
    (tmp_path / "driver.py").write_text(_REAL_TEST_DRIVER)
    tests = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(tmp_path), str(tests), os.environ.get("PYTHONPATH")) if p)
    argv = ["test", *tiny_args(tmp_path), "--data.init_args.test_episodes", "2048"]
    out = tmp_path / "grid"
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(SCRIPT), str(out), json.dumps(argv)],
                              env=dict(os.environ, PYTHONPATH=path), cwd=SCRIPT.parents[1], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        rc, _, err = _stopped_when_started(driver, [out / "t0" / "testing"], "sigterm")
    finally:  # a driver that hangs, and its worker, must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert rc == 143, err
    assert "stopped by SIGTERM: the running tests were stopped" in err
    _assert_gone(int((out / "t0" / "testing").read_text()))
    assert not (out / "t0" / "done").exists() and not (out / "t1").exists()
    assert json.loads((out / "t0" / "job_state.json").read_text())["state"] == "failed"


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stopped_driver_stops_its_running_fits_and_starts_no_more(tmp_path, stop: str) -> None:
    """Stopped by SIGTERM (a cluster's preemption, ``kill``), the driver passes it on to the fits it runs, which save
    their last.ckpt and exit; it starts no other job and exits 143. Before, the fits kept training without it, and
    a rerun of the driver started a second process in the same run folder. Ctrl-C at the terminal reaches the fits
    itself (each stops as SIGTERM stops it); the driver passes SIGTERM on as well, starts nothing more and exits
    130, where it used to print a KeyboardInterrupt traceback."""
    signum, name = STOPS[stop]
    (tmp_path / "slow_lit_icl.py").write_text(_SLOW_CLI)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "grid"
    rc, printed, err = _stop_once_started(tmp_path, _DRIVER, [out / f"s{i}" / "started" for i in range(2)], stop, env)
    assert rc == 128 + signum, err
    assert f"stopped by {name}: the running fits saved their last.ckpt" in err
    assert "Traceback" not in err
    for i in range(2):  # both fits got a signal to stop and are gone
        assert {p.name for p in (out / f"s{i}").glob("got_*")} & {"got_sigterm", "got_sigint"}
        with pytest.raises(ProcessLookupError):
            os.kill(int((out / f"s{i}" / "started").read_text()), 0)
    assert not (out / "s2").exists()  # the third job never started
    assert f"fit 2: not started ({name})" in printed
    # The stopped fits are named as stopped, to be resumed, not as failed.
    assert "FAILED" not in printed
    for i in range(2):
        assert f"fit {i}: stopped by {name} (rc=" in printed
        assert "the rerun resumes it from its last.ckpt where it saved one" in printed


def test_report_names_a_job_ended_by_sigterm_or_ctrl_c_as_stopped_not_failed(runner, tmp_path) -> None:
    """A job stopped by SIGTERM or Ctrl-C (the CLI's 143 or 130) was listed as "failed with exit code 143"."""
    import argparse

    jobs = [runner.Job(f"fit {rc}", ["fit"], tmp_path / str(rc)) for rc in (143, 130, 1, -9)]
    for job in jobs:
        runner.write_state(job.folder, "failed", rc=int(job.folder.name), executor="local", job_id=None)
    lines = runner.unfinished(jobs, argparse.Namespace(out=tmp_path))
    assert f"- fit 143: stopped by SIGTERM (exit code 143, local); see {tmp_path / '143' / 'fit.log'}" in lines
    assert f"- fit 130: stopped by Ctrl-C (exit code 130, local); see {tmp_path / '130' / 'fit.log'}" in lines
    assert f"- fit 1: failed with exit code 1 (local); see {tmp_path / '1' / 'fit.log'}" in lines
    # SIGKILL (the kernel's OOM killer, a kill -9): said as such, not as "failed with exit code -9".
    assert f"- fit -9: killed by SIGKILL (exit code -9, local); see {tmp_path / '-9' / 'fit.log'}" in lines
    assert runner._ended(jobs[3], -9) == f"KILLED by SIGKILL (rc=-9, see {tmp_path / '-9' / 'fit.log'})"
    # Stopped by the SIGTERM of a requeue and back in the queue: what it does now, not how its last sitting ended.
    runner.write_state(jobs[0].folder, "failed", rc=143, executor="slurm", job_id="8")
    assert runner.why_unfinished(jobs[0], {"8": "PENDING"}) == "pending (SLURM job 8)"


def test_the_dry_run_of_all_says_when_its_tests_would_run(runner, tmp_path, capsys) -> None:
    """``all --dry-run`` printed the fits, then "wait for runs that have not finished (run `fit` first)" for the
    tests, as if the user had not asked for the fits too."""
    fit = runner.Job("fit a s0", ["fit"], tmp_path / "a")
    test = runner.Job("test a s0", ["test"], tmp_path / "t", after=[tmp_path / "a"])
    import argparse

    args = argparse.Namespace(jobs=1, threads=1, dry_run=True, stage="all")
    assert runner.run_all([fit], args, "fit") == 0 and runner.run_all([test], args, "test") == 0
    out = capsys.readouterr().out
    assert "1 would run once the fits above have finished, e.g. test a s0" in out and "run `fit` first" not in out
    args.stage = "test"
    runner.run_all([test], args, "test")
    assert "1 wait for runs that have not finished (run `fit` first)" in capsys.readouterr().out


@pytest.mark.parametrize("module, instead", [("tidy", "python experiments/runner.py tidy"),
                                             ("cluster", "--executor slurm")])
@pytest.mark.parametrize("argv", [["--help"], []])
def test_a_library_module_run_as_a_script_says_it_is_none_and_what_to_run(module, instead, argv) -> None:
    """``python experiments/tidy.py --help`` (and cluster.py) printed nothing and exited 0: they are modules of the
    drivers, with no command line. Now they say so in one line, naming the command to run, and exit 2."""
    done = subprocess.run([sys.executable, str(SCRIPT.parent / f"{module}.py"), *argv], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"{module}.py: a module of the experiment drivers, not a command; ")
    assert instead in done.stderr



def _fake_squeue(tmp_path: Path, monkeypatch, lines: str) -> None:
    """An ``squeue`` on PATH that lists ``lines`` (``%i %T %j``) as the queue, whatever it is asked (and an
    ``sbatch``)."""
    bin_dir = tmp_path / "fake_bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat <<'END'\n{lines}\nEND\n")
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 1\n")  # --executor slurm checks that it is there
    for tool in ("squeue", "sbatch"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _run_driver(runner, argv: list[str], fits, script: str = "experiments/driver.py") -> int:
    parser = _driver_parser(runner)
    parse = lambda a: runner.parse_driver_args(parser, a, script)
    args = parse(argv)
    args.out = args.out.resolve()
    with pytest.raises(SystemExit) as stop:
        runner.drive(args, fits, lambda a: [], lambda a: "THE REPORT", parse)
    return stop.value.code


def test_a_grid_whose_slurm_jobs_are_still_queued_is_not_run_again_beside_them(runner, quick_cli, tmp_path,
                                                                             monkeypatch, capsys) -> None:
    """A driver stopped while it waited leaves its grid's jobs in SLURM's queue; the same command again submitted
    every job a second time, and the two copies of a fit ran at once in one run folder."""
    import argparse

    from cluster import grid_name

    out = (tmp_path / "grid").resolve()
    name = grid_name(argparse.Namespace(out=out, script=Path("experiments/other_driver.py")))
    _fake_squeue(tmp_path, monkeypatch, f"16_0 RUNNING {name}\n16_1 PENDING {name}\n17 PENDING lit_icl.x.0000")
    fit = runner.Job("fit a s0", ["fit", "--help"], out / "a" / "s0")
    for executor in ("local", "slurm"):
        monkeypatch.setitem(sys.modules, "submitit", sys.modules["runner"])  # any module: as if submitit were there
        monkeypatch.setattr("cluster.check_submission", lambda args: None)
        code = _run_driver(runner, ["all", "--out", str(out), "--executor", executor], lambda a: [fit])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"driver.py: error: 2 SLURM jobs of the grid in {out} are still in the queue "
                                 "(16_0 running, 16_1 pending)") and "scancel 16" in err[0]
        assert not out.exists()  # nothing written
    _fake_squeue(tmp_path, monkeypatch, f"16_0 RUNNING {name}")
    monkeypatch.setenv("SLURM_JOB_ID", "16_0")  # the stage job of stage `all` does not count itself
    from cluster import queued_in_folder
    assert queued_in_folder(out) == {}


def test_a_second_driver_is_refused_while_one_runs_the_grid_and_another_drivers_folder_is_refused(
        runner, quick_cli, tmp_path, capsys) -> None:
    """Two drivers running one grid at once ran every job twice; a driver run into another driver's folder mixed
    the two grids' runs in both reports."""
    import fcntl

    out = (tmp_path / "grid").resolve()
    fit = runner.Job("fit a s0", ["fit", "--help"], out / "a" / "s0")
    out.mkdir()
    with open(out / "grid.lock", "a+") as held:  # a driver running this grid now
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 4242 on node7: driver.py all --out grid\n")
        held.flush()
        code = _run_driver(runner, ["all", "--out", str(out)], lambda a: [fit])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(
            f"driver.py: error: another driver is running the grid in {out} now (pid 4242 on node7: driver.py all")
        assert not fit.folder.exists() and not (out / "grid.json").exists()
    # Once it has ended, the grid runs; and its stage leaves the folder unlocked behind it.
    assert _run_driver(runner, ["all", "--out", str(out)], lambda a: [fit]) == 0 and fit.done
    assert _run_driver(runner, ["all", "--out", str(out)], lambda a: [fit]) == 0
    capsys.readouterr()
    code = _run_driver(runner, ["all", "--out", str(out)], lambda a: [fit], script="experiments/other_driver.py")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [(f"other_driver.py: error: --out {out} holds the grid of driver.py (its grid.json), "
                                  "and a report reads every run under its folder: give this driver an --out of its own")]
    assert json.loads((out / "grid.json").read_text())["script"].endswith("driver.py")


def test_a_driver_stopped_while_it_waits_for_slurm_says_the_jobs_go_on_and_how_to_read_them(
        runner, tmp_path, monkeypatch, capsys) -> None:
    """Ctrl-C while the driver waited for the queue printed a KeyboardInterrupt traceback and no word of the jobs,
    which go on in the queue."""
    import argparse

    import cluster

    monkeypatch.setattr(cluster, "queue_states", lambda job_ids=(), name=None: {"16_0": "RUNNING"})

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster.time, "sleep", interrupted)
    args = argparse.Namespace(out=(tmp_path / "grid").resolve(), script=Path("experiments/driver.py").resolve(),
                              poll_s=1.0)
    with pytest.raises((SystemExit, KeyboardInterrupt)) as stop:  # not a KeyboardInterrupt, which ends pytest
        cluster.wait_for_grid(args)
    assert stop.type is SystemExit and stop.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stopped waiting (Ctrl-C): the grid's SLURM jobs go on in the queue")
    assert f"report --out {args.out}" in err[0] and f"scancel --name={cluster.grid_name(args)}" in err[0]


@pytest.mark.parametrize("unfinished, code", [(0, 0), (2, 1), (256, 1)])
def test_a_slurm_stage_exits_1_when_jobs_did_not_finish_whatever_their_number(runner, tmp_path, monkeypatch,
                                                                              unfinished, code) -> None:
    """The SLURM stage exited with the number of unfinished jobs: 2 (a refusal's status) for two, 0 for 256."""
    import cluster

    monkeypatch.setitem(sys.modules, "submitit", sys.modules["runner"])  # any module: as if submitit were there
    monkeypatch.setattr("shutil.which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(cluster, "run_stage_on_slurm", lambda *a: unfinished)
    args = runner.parse_driver_args(_driver_parser(runner), ["all", "--out", str(tmp_path), "--executor", "slurm"],
                                    "experiments/driver.py")
    with pytest.raises(SystemExit) as stop:
        runner.run_stage(args, lambda a: [], lambda a: [])
    assert stop.value.code == code


def test_a_fit_or_all_with_other_settings_than_the_grids_started_runs_is_refused(runner, quick_cli, tmp_path,
                                                                                 capsys) -> None:
    """``all --steps 8`` over a grid run with ``--steps 6`` skipped the finished runs and recorded 8 in grid.json,
    and a seed added with ``--steps 8`` was averaged with the 6-step seeds in one cell. Other seeds alone are a grid
    run in parts, as are other arms (options that choose cells); a grid whose runs never started may be run with
    other settings."""
    parser = _driver_parser(runner)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=["a"])
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out = (tmp_path / "grid").resolve()

    def fits(args):
        return [runner.Job(f"fit {a} s{s}", ["fit", "--help", str(args.steps)], out / a / f"s{s}")
                for a in args.arms for s in args.seeds]

    def run(*argv: str) -> int:
        args = parse(["all", "--out", str(out), *argv])
        args.out = args.out.resolve()
        with pytest.raises(SystemExit) as stop:
            runner.drive(args, fits, lambda a: [], lambda a: "THE REPORT", parse)
        return stop.value.code

    out.mkdir()
    (out / "grid.json").write_text(json.dumps({"cwd": str(tmp_path), "script": "experiments/driver.py",
                                               "argv": ["all", "--steps", "4", "--out", str(out)]}))
    assert run("--steps", "6", "--seeds", "0") == 0  # the recorded grid never started a run
    assert run("--steps", "6", "--seeds", "1") == 0
    assert run("--steps", "6", "--seeds", "1", "--arms", "b") == 0 and (out / "b" / "s1" / "done").is_file()
    assert run("--steps", "6", "--seeds", "1") == 0
    capsys.readouterr()
    for seeds in ("0", "2"):
        assert run("--steps", "8", "--seeds", seeds) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [(f"driver.py: error: this all takes --steps 8, but the grid in {out} has runs made with --steps "
                        f"6 ({out / 'grid.json'}); its finished runs would not be run again and a report would mix "
                        "both: give the grid's options, or give the new settings an --out of their own")]
    assert not (out / "a" / "s2").exists()
    assert json.loads((out / "grid.json").read_text())["argv"][-4:] == ["--steps", "6", "--seeds", "1"]


def test_a_test_stage_given_other_fit_settings_does_not_change_what_the_grids_fits_were_made_with(
        runner, quick_cli, tmp_path, capsys) -> None:
    """``test --steps 8`` over fits trained with ``--steps 6`` (a note, and it tests those fits) added its options
    to grid.json after the fits', so the record said 8: the grid's own ``all --steps 6 --seeds 1`` was then refused
    as a change of settings, and ``all --steps 8 --seeds 1`` trained seed 1 with 8 steps beside seed 0's 6 in one
    cell. Each finished run is now compared with the command line it ran (its job.json): a test given other test
    episodes than its finished tests ran with is refused too, whatever the record says."""
    parser = _driver_parser(runner)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--test-episodes", type=int, default=512)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out = (tmp_path / "grid").resolve()

    def fits(args):  # the test episodes do not reach a fit
        return [runner.Job(f"fit s{s}", ["fit", "--help", str(args.steps)], out / f"s{s}") for s in args.seeds]

    def tests(args):
        return [runner.Job(f"test s{s}", ["test", "--help", str(args.test_episodes)], out / f"s{s}_test",
                           after=[out / f"s{s}"]) for s in args.seeds]

    def run(*argv: str) -> int:
        args = parse([*argv, "--out", str(out)])
        args.out = args.out.resolve()
        with pytest.raises(SystemExit) as stop:
            runner.drive(args, fits, tests, lambda a: "THE REPORT", parse)
        return stop.value.code

    assert run("all", "--steps", "6", "--seeds", "0") == 0  # seed 0 tested on 512 episodes
    assert json.loads((out / "s0" / "job.json").read_text())["argv"] == ["fit", "--help", "6"]
    assert run("test", "--steps", "8") == 0
    assert "note: this test takes --steps 8; the grid's own command" in capsys.readouterr().err
    assert run("all", "--steps", "6", "--seeds", "1") == 0 and (out / "s1_test" / "done").is_file()
    capsys.readouterr()
    assert run("all", "--steps", "8", "--seeds", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"this all takes --steps 8, but the grid in {out} has runs made with --steps 6 (" in err[0]
    # The finished tests ran on 512 episodes: tests of other seeds on 16 would sit beside them in one table.
    for stage in ("test", "all"):
        assert run(stage, "--steps", "6", "--test-episodes", "16", "--seeds", "2") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "16" in err[0] and "512" in err[0], err
    assert not (out / "s2").exists() and not (out / "s2_test").exists()


def test_a_fit_that_failed_before_its_first_checkpoint_may_be_rerun_with_its_data_fixed(runner, quick_cli, tmp_path,
                                                                                       capsys) -> None:
    """One fit of a grid failed on bad data (a wrong --image-root) while the rest finished. Its rerun with the right
    option was refused as a change of the grid's settings, though no finished run used it: the report's rerun
    command failed the same way again and the only way out was a new --out, training the whole grid again."""
    parser = _driver_parser(runner)
    parser.add_argument("--image-root", default="bad")
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    out = (tmp_path / "grid").resolve()

    def fits(args):  # the stand-in CLI exits 0 for --help, 2 otherwise: the bad root fails its fit
        root = ["--help"] if args.image_root == "good" else ["--root", args.image_root]
        return [runner.Job("fit synthetic", ["fit", "--help"], out / "synthetic"),
                runner.Job("fit images", ["fit", *root], out / "images")]

    def run(*argv: str) -> int:
        args = parse(["all", *argv, "--out", str(out)])
        args.out = args.out.resolve()
        with pytest.raises(SystemExit) as stop:
            runner.drive(args, fits, lambda a: [], lambda a: "THE REPORT", parse)
        return stop.value.code

    assert run("--image-root", "bad") == 1 and (out / "synthetic" / "done").is_file()
    assert not (out / "images" / "done").is_file()
    assert run("--image-root", "good") == 0 and (out / "images" / "done").is_file()
    capsys.readouterr()
    assert run("--image-root", "other") == 2  # now a finished run has it
    assert "this all takes --image-root other, but the grid" in capsys.readouterr().err


_RUN_JOB = '''import importlib.util, sys
spec = importlib.util.spec_from_file_location("runner", sys.argv[1])
runner = importlib.util.module_from_spec(spec)
sys.modules["runner"] = runner
spec.loader.exec_module(runner)
runner.CLI_MODULE = "slow_lit_icl"
runner.main(["run-job", sys.argv[2]])
'''


def test_a_slurm_task_stopped_by_sigterm_records_its_fit_as_stopped(runner, tmp_path) -> None:
    """``scancel`` (or a requeue) sends SIGTERM to every process of a SLURM task: the fit saved its ``last.ckpt`` and
    exited 143, but ``runner.py run-job`` died at once without recording it, so ``report`` said "started but did not
    finish (killed, timed out, ...)". The task's runner now passes SIGTERM on, waits for the fit and records the
    stop."""
    (tmp_path / "slow_lit_icl.py").write_text(_SLOW_CLI)
    (tmp_path / "run_job.py").write_text(_RUN_JOB)
    folder = tmp_path / "grid" / "s0"
    job = runner.Job("fit s0", ["fit", str(folder)], folder)
    job.write_spec(threads=1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p),
               SLURM_JOB_ID="26", SLURM_ARRAY_JOB_ID="26", SLURM_ARRAY_TASK_ID="1")
    task = subprocess.Popen([sys.executable, str(tmp_path / "run_job.py"), str(SCRIPT), str(folder)], env=env)
    try:
        for _ in range(300):
            if (folder / "started").is_file():
                break
            time.sleep(0.1)
        assert (folder / "started").is_file()
        task.send_signal(signal.SIGTERM)  # to the task's runner alone; SLURM sends it to the fit as well
        assert task.wait(timeout=30) == 143
    finally:
        task.kill()
    assert (folder / "got_sigterm").is_file() and not job.done
    state = runner.read_state(folder)
    assert state["state"] == "failed" and state["rc"] == 143 and state["job_id"] == "26_1"
    assert runner.why_unfinished(job, {}).startswith("stopped by SIGTERM (exit code 143, SLURM job 26_1)")


def test_a_local_test_stage_whose_tests_wait_for_unfinished_fits_exits_1_and_lists_them(runner, quick_cli, tmp_path,
                                                                                       capsys) -> None:
    """Locally, ``test`` before its fits had finished said "1 wait for runs that have not finished" and exited 0, where
    the same stage on SLURM exits 1 and lists the tests that did not run."""
    out = (tmp_path / "grid").resolve()
    fit = runner.Job("fit a s0", ["fit", "--help"], out / "a" / "s0")
    test = runner.Job("test a s0", ["test", "--help"], out / "a" / "s0_test", after=[fit.folder])
    parser = _driver_parser(runner)
    parse = lambda argv: runner.parse_driver_args(parser, argv, "experiments/driver.py")
    args = parse(["test", "--out", str(out)])
    args.out = args.out.resolve()
    with pytest.raises(SystemExit) as stop:
        runner.drive(args, lambda a: [fit], lambda a: [test], lambda a: "", parse)
    assert stop.value.code == 1
    assert f"- test a s0: not run (its fit {fit.folder} has not finished)" in capsys.readouterr().err


def test_stopping_the_local_slurm_ends_its_own_job_steps_only(tmp_path) -> None:
    """``scripts/slurm_local.sh stop`` ended every ``slurmstepd`` on the machine (``pkill -f``), so the test module's
    cluster, stopping, killed the running jobs of a user's cluster, and the other way round. Needs neither SLURM nor
    root: stand-in steps named as slurmstepd names its processes, one in this cluster's folder, one elsewhere."""
    script = SCRIPT.parents[1] / "scripts" / "slurm_local.sh"
    mine, other = tmp_path / "cluster", tmp_path / "other_cluster"
    mine.mkdir()
    other.mkdir()
    steps = {folder: subprocess.Popen(["bash", "-c", 'exec -a "slurmstepd: [7.0]" sleep 60'], cwd=folder)
             for folder in (mine, other)}
    try:
        time.sleep(0.5)  # each has become "slurmstepd: [7.0]"
        subprocess.run(["bash", str(script), "stop"], env=dict(os.environ, LIT_ICL_SLURM_DIR=str(mine)), check=True,
                       capture_output=True)
        assert steps[mine].wait(timeout=10) == -signal.SIGTERM
        assert steps[other].poll() is None  # another cluster's step runs on
    finally:
        for step in steps.values():
            step.kill()
    assert not mine.exists()


GRID_DRIVERS = ["coqe_omniglot_cpu", "icssl_fig3_sweep", "icssl_paper_tables", "icssl_swiss_roll_ablation",
                "i2cl_recipes", "mmca_avmnist_table1"]


@pytest.mark.parametrize("name", GRID_DRIVERS)
def test_every_drivers_report_of_an_empty_grid_is_one_line_and_status_2(name: str, tmp_path, capsys) -> None:
    """`report` of a grid with no tested run: three drivers printed empty tables and exited 0, one printed a
    bare line; each now refuses in the drivers' one line, naming the folder and the stage to run. A report asked
    for the tidy CSV (``--csv``) writes it and notes that there are no tables."""
    from conftest import load_script

    driver = load_script(Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as refused:
        driver.main(["report", "--out", str(tmp_path / "empty")])
    assert refused.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert err == [(f"{name}.py: error: no tested runs under {tmp_path / 'empty'}; start them with `all` (or "
                    "`fit`, then `test`) first")]
    # With --csv the report was asked for the tidy CSV, which it writes (of no run here): a note, status 0.
    driver.main(["report", "--out", str(tmp_path / "empty"), "--csv", str(tmp_path / "rows.csv")])
    err = capsys.readouterr().err
    assert f"note: no tested runs under {tmp_path / 'empty'}, so no tables; {tmp_path / 'rows.csv'} holds" in err
    assert (tmp_path / "rows.csv").is_file() and "error" not in err



def test_a_driver_pointed_at_another_drivers_grid_is_refused_in_every_stage_report_and_dry_run_included(
        tmp_path, capsys) -> None:
    """Only a stage that ran jobs checked whose grid a folder holds: the Swiss-roll ablation's report of the tables'
    grid printed its table with every cell empty and said the grid's command "no longer parses", and a dry run
    printed the commands that the real run would refuse."""
    from conftest import load_script

    experiments = Path(__file__).resolve().parents[1] / "experiments"
    tables = load_script(experiments / "icssl_paper_tables.py")
    out = (tmp_path / "grid").resolve()
    import runner  # the drivers' runner, on the import path once a driver is loaded

    # The tables' grid, one of its tests finished.
    runner.record_grid(tables.parse_args(["all", "--out", str(out), "--seeds", "0", "--steps", "2", "--epochs", "1"]))
    finished = out / "tuned_rbf_only_spiral" / "s0_test_manifolds"
    finished.mkdir(parents=True)
    (finished / "results.json").write_text(json.dumps({"meta": {}, "rows": [
        {"metric": "accuracy", "value": 0.5, "split": "test", "method": "m", "n_labeled": 3}]}))
    (finished / "done").write_text("1.0 s\n")
    before = sorted(out.rglob("*"))
    ablation = load_script(experiments / "icssl_swiss_roll_ablation.py")
    for argv, line in (
            (["report"], (f"icssl_swiss_roll_ablation.py: error: --out {out} holds the grid of icssl_paper_tables.py "
                          "(its grid.json), whose runs this driver's report does not read: report it with `python "
                          f"experiments/icssl_paper_tables.py report --out {out}`")),
            (["fit", "--seeds", "0", "--dry-run"],
             (f"icssl_swiss_roll_ablation.py: error: --out {out} holds the grid of icssl_paper_tables.py (its "
              "grid.json), and a report reads every run under its folder: give this driver an --out of its own"))):
        with pytest.raises(SystemExit) as refused:
            ablation.main([*argv, "--out", str(out)])
        printed, err = capsys.readouterr()
        assert refused.value.code == 2 and err.strip().splitlines() == [line] and printed == "", (printed, err)
    assert sorted(out.rglob("*")) == before


CONVERGENCE_DRIVERS = ["icssl_fig3_sweep", "icssl_paper_tables", "icssl_swiss_roll_ablation"]


@pytest.mark.parametrize("name", CONVERGENCE_DRIVERS)
@pytest.mark.parametrize(("argv", "problem"), [
    (["--patience", "0"], "--patience 0: give 1 or more validation rounds without improvement"),
    (["--patience", "2", "--val-every", "0"], "--val-every 0: validate every 1 or more steps"),
    (["--patience", "2", "--min-delta", "-0.1"], "--min-delta -0.1: the smallest rise that counts as an improvement"),
    (["--steps", "0"], "argument --steps: 0 must be at least 1"),
])
def test_every_driver_with_the_shared_early_stopping_options_checks_them_in_one_line(name, tmp_path, capsys, argv,
                                                                                      problem) -> None:
    """The drivers that take ``add_convergence_args``' options all refuse them through ``check_convergence_args``
    (the Swiss-roll ablation took them unchecked: ``--patience 0`` reached every fit)."""
    from conftest import load_script

    driver = load_script(Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py")
    with pytest.raises(SystemExit) as refused:
        driver.parse_args(["fit", "--out", str(tmp_path / "grid"), *argv])
    assert refused.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 1 and f": error: {problem}" in err[0], err
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize("name", CONVERGENCE_DRIVERS)
def test_val_every_without_patience_is_refused_where_patience_is_off_by_default(name, tmp_path, capsys) -> None:
    """``--val-every`` spaces the early-stopping rule's validation rounds; a fixed-length run validates once an
    epoch (``--epochs``), so without ``--patience`` it was accepted and did nothing. The Swiss-roll ablation always
    stops early (``--patience`` 5 by default), so there it is taken."""
    from conftest import load_script

    driver = load_script(Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py")
    argv = ["fit", "--out", str(tmp_path / "grid"), "--val-every", "50"]
    if name == "icssl_swiss_roll_ablation":
        assert driver.parse_args(argv).val_every == 50
        return
    with pytest.raises(SystemExit) as refused:
        driver.parse_args(argv)
    assert refused.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 1 and err[0].endswith(
        ": error: --val-every 50 is the interval of early stopping's validation rounds, which only --patience turns "
        "on (a fixed-length run trains all its --steps); add --patience P or drop --val-every"), err
    assert not (tmp_path / "grid").exists()

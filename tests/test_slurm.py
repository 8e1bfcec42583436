"""Grids through a real SLURM (``--executor slurm``): the avMNIST Table 1 and IC-SSL tables drivers, end to end.

A one-node cluster is started for this module by ``scripts/slurm_local.sh`` (munge, slurmctld, slurmd with four
CPU slots; state in a temporary folder); each test runs a driver as a user would, ``all --executor slurm`` from
submission to report, and compares it with the same grid through ``--executor local``. Marked ``slurm``: run with
``pytest -m slurm`` as root, with ``apt-get install slurm-wlm munge`` and ``pip install -e '.[cluster]'``; without
them the module skips with one line saying what is missing.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
TABLE1 = REPO / "experiments" / "mmca_avmnist_table1.py"
TABLES = REPO / "experiments" / "icssl_paper_tables.py"
#: Two models of Table 1 over two seeds: 4 fits, 4 tests.
TABLE1_GRID = ["--seeds", "0", "1", "--only", "full s", "bi_cross_attention s"]
#: Two Tables 2-4 models over two seeds: 4 fits, 4 tests.
TABLES_GRID = ["--seeds", "0", "1", "--steps", "6", "--epochs", "2", "--val-episodes", "16", "--test-episodes", "16",
               "--only", "tuned_rbf_only_sphere ", "tuned_rbf_only_torus "]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the SLURM daemons need root"
    tools = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel") if shutil.which(t) is None]
    if tools:
        return f"{', '.join(tools)} not installed (apt-get install slurm-wlm munge)"
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit not installed (pip install -e '.[cluster]')"
    return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict[str, str]:
    """A running one-node SLURM; the environment its clients need (``SLURM_CONF``)."""
    why = _missing()
    if why is not None:
        pytest.skip(f"no local SLURM: {why}")
    state = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ, LIT_ICL_SLURM_DIR=str(state / "cluster"), LIT_ICL_SLURM_CPUS="4",
               LIT_ICL_SLURM_PORT="6917")
    started = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stderr
    env["SLURM_CONF"] = started.stdout.strip().rsplit("=", 1)[1]
    yield env
    subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, check=False)


@pytest.fixture(scope="module")
def avmnist(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny avMNIST layout (``root``) and an overlay that makes Table 1's models seconds-long."""
    sys.path.insert(0, str(REPO / "tests"))
    from mmca.avmnist.helpers import write_layout

    folder = tmp_path_factory.mktemp("avmnist")
    write_layout(folder / "avm", n_train=240, n_test=40)
    overlay = folder / "tiny.yaml"
    overlay.write_text("model: {init_args: {net: {init_args: {depth: 1}}}}\n"
                       "data: {init_args: {val_size: 8, batch_size: 16, eval_batch_size: 10}}\n")
    return folder / "avm", overlay


def _driver(script: Path, env: dict[str, str], *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(script), *argv], env=env, capture_output=True, text=True, cwd=REPO,
                          timeout=900, check=False)
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _rows(script: Path, out: Path, env: dict[str, str], csv_path: Path) -> set[tuple]:
    """The grid's tidy rows without what differs between two runs of one job: times, CPU seconds, commit."""
    _driver(script, env, "report", "--out", str(out), "--csv", str(csv_path))
    rows = set()
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            if row["metric"] != "wall_s":
                rows.add(tuple(sorted((k, v) for k, v in row.items() if k not in ("cpu_s", "commit"))))
    return rows


def _queue(env: dict[str, str]) -> str:
    return subprocess.run(["squeue", "--noheader", "--array", "--format=%i %T %j"], env=env, capture_output=True,
                          text=True, check=False).stdout


def _state(folder: Path) -> dict:
    import json

    return json.loads((folder / "job_state.json").read_text())


def test_table1_grid_runs_through_slurm_to_its_report_and_matches_the_local_executor(slurm, avmnist, tmp_path) -> None:
    root, overlay = avmnist
    common = ["--root", str(root), "--overlay", str(overlay), "--max-epochs", "3", *TABLE1_GRID]
    on_slurm = _driver(TABLE1, slurm, "all", "--executor", "slurm", "--poll-s", "1", "--jobs", "4",
                       "--out", str(tmp_path / "slurm"), *common)
    # Submission, the dependent test stage, the wait and the report, with no hand step.
    assert "submitted 4 fit jobs as SLURM array" in on_slurm.stdout
    assert "submitted the test stage as SLURM job" in on_slurm.stdout
    assert "| full |" in on_slurm.stdout and "| bi_cross_attention |" in on_slurm.stdout
    assert "did not finish" not in on_slurm.stderr
    runs = sorted(p.parent for p in (tmp_path / "slurm").glob("*/*/done"))
    assert len(runs) == 8
    fits = [r for r in runs if "_test_" not in r.name]
    for run in runs:
        state = _state(run)
        assert state["executor"] == "slurm" and state["state"] == "done" and state["rc"] == 0
        assert "_" in state["job_id"]  # a task of a job array
    # The tests ran as the array the stage job submitted after every fit had ended.
    fit_arrays = {_state(r)["job_id"].split("_")[0] for r in fits}
    test_arrays = {_state(r)["job_id"].split("_")[0] for r in runs if r not in fits}
    assert len(fit_arrays) == len(test_arrays) == 1 and int(test_arrays.pop()) > int(fit_arrays.pop())
    assert not any(line.split()[2].startswith("lit_icl.") for line in _queue(slurm).splitlines())

    on_local = _driver(TABLE1, slurm, "all", "--executor", "local", "--jobs", "2", "--out", str(tmp_path / "local"),
                       *common)
    assert on_local.stdout.split("| model |", 1)[1] == on_slurm.stdout.split("| model |", 1)[1]
    slurm_rows = _rows(TABLE1, tmp_path / "slurm", slurm, tmp_path / "slurm.csv")
    assert slurm_rows == _rows(TABLE1, tmp_path / "local", slurm, tmp_path / "local.csv") and len(slurm_rows) > 8


def test_icssl_tables_grid_runs_through_slurm_to_its_report_and_matches_the_local_executor(slurm, tmp_path) -> None:
    on_slurm = _driver(TABLES, slurm, "all", "--executor", "slurm", "--poll-s", "1", "--jobs", "4",
                       "--out", str(tmp_path / "slurm"), *TABLES_GRID)
    assert "submitted 4 fit jobs as SLURM array" in on_slurm.stdout
    assert "| rbf-sphere |" in on_slurm.stdout and "| rbf-torus |" in on_slurm.stdout
    assert len(list((tmp_path / "slurm").glob("*/*/done"))) == 8
    on_local = _driver(TABLES, slurm, "all", "--out", str(tmp_path / "local"), *TABLES_GRID)
    assert on_local.stdout.split("### ", 1)[1] == on_slurm.stdout.split("### ", 1)[1]
    assert _rows(TABLES, tmp_path / "slurm", slurm, tmp_path / "s.csv") == _rows(
        TABLES, tmp_path / "local", slurm, tmp_path / "l.csv")


def _wait(predicate, what: str, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def _epochs_trained(ckpt: Path) -> int:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["epoch"]


def _fit_in_flight(slurm: dict[str, str], avmnist: tuple[Path, Path], out: Path, seed: int):
    """Submit one 12-epoch Table 1 fit (``--no-wait``) and wait until it runs past its first checkpoint; its grid
    arguments, run folder, ``last.ckpt`` and SLURM job id."""
    root, overlay = avmnist
    grid = ["--root", str(root), "--overlay", str(overlay), "--max-epochs", "12", "--seeds", str(seed),
            "--only", "full s", "--poll-s", "1"]
    _driver(TABLE1, slurm, "fit", "--executor", "slurm", "--no-wait", "--out", str(out), *grid)
    run = out / "full" / f"s{seed}"
    last = run / "checkpoints" / "last.ckpt"
    _wait(lambda: last.is_file() and _state(run)["state"] == "running", "the fit's first checkpoint")
    time.sleep(0.5)  # the checkpoint written whole; the fit is in its next epoch
    return grid, run, last, _state(run)["job_id"]


def test_a_killed_fit_is_reported_and_resubmitting_resumes_it_from_its_last_checkpoint(slurm, avmnist, tmp_path) -> None:
    out = tmp_path / "slurm"
    grid, run, last, job_id = _fit_in_flight(slurm, avmnist, out, seed=0)
    subprocess.run(["scancel", "--signal=KILL", job_id], env=slurm, check=True)
    _wait(lambda: job_id not in _queue(slurm), "the killed job to leave the queue")
    assert not (run / "done").exists()
    kept = _epochs_trained(last)
    assert kept < 11  # killed before its end

    # The report names the job, why it did not finish and the command that reruns it; with no tested run to show
    # it is refused in one line first (status 2), as every driver's report of such a grid.
    report = _driver(TABLE1, slurm, "report", "--out", str(out), check=False)
    assert report.returncode == 2 and f"mmca_avmnist_table1.py: error: no tested runs under {out}" in report.stderr
    # Killed with no exit recorded, or, where the task's runner outlived the signal and passed SIGTERM on to the fit
    # (which saved its last.ckpt), stopped by SIGTERM: which one depends on how the node signals a cancelled step.
    assert (f"fit full s0: started but did not finish (SLURM job {job_id}" in report.stderr
            or f"fit full s0: stopped by SIGTERM (exit code 143, SLURM job {job_id})" in report.stderr), report.stderr
    assert "Rerun them" in report.stderr and str(out) in report.stderr

    # Resubmitted: the fit resumes from its last checkpoint (the work since it is what was lost) and then gives
    # the numbers of a fit that was never interrupted.
    _driver(TABLE1, slurm, "all", "--executor", "slurm", "--out", str(out), *grid)
    log = (run / "fit.log").read_text()
    assert log.count("$ ") == 2 and "--ckpt_path last" in log.split("$ ")[2].splitlines()[0]
    assert f"Restoring states from the checkpoint path at {last}" in log
    assert _state(run)["state"] == "done"
    _driver(TABLE1, slurm, "all", "--out", str(tmp_path / "local"), *grid)
    assert _rows(TABLE1, out, slurm, tmp_path / "s.csv") == _rows(TABLE1, tmp_path / "local", slurm,
                                                                    tmp_path / "l.csv")


def test_a_job_that_slurm_requeues_resumes_from_its_last_checkpoint_by_itself(slurm, avmnist, tmp_path) -> None:
    out = tmp_path / "slurm"
    grid, run, last, job_id = _fit_in_flight(slurm, avmnist, out, seed=1)
    subprocess.run(["scontrol", "requeue", job_id], env=slurm, check=True)
    _wait(lambda: (run / "done").is_file(), "the requeued job to finish")
    state = _state(run)
    assert state["restarts"] >= 1 and state["state"] == "done"
    assert f"Restoring states from the checkpoint path at {last}" in (run / "fit.log").read_text()
    _wait(lambda: job_id not in _queue(slurm), "the job to leave the queue")
    _driver(TABLE1, slurm, "fit", "--out", str(tmp_path / "local"), *grid)
    assert _epochs_trained(last) == _epochs_trained(tmp_path / "local" / "full" / "s1" / "checkpoints" / "last.ckpt")
    assert _rows(TABLE1, out, slurm, tmp_path / "s.csv") == _rows(TABLE1, tmp_path / "local", slurm,
                                                                    tmp_path / "l.csv")


def test_a_fit_longer_than_its_time_limit_requeues_itself_and_resumes(slurm, avmnist, tmp_path) -> None:
    # --time-min 2: SLURM warns each sitting after 30 s (submitit's USR2, 90 s before the limit); the task
    # requeues itself and the next sitting resumes from the fit's last checkpoint, until the fit is done.
    root, overlay = avmnist
    grid = ["--root", str(root), "--overlay", str(overlay), "--max-epochs", "60", "--seeds", "2", "--only", "full s"]
    out = tmp_path / "slurm"
    done = _driver(TABLE1, slurm, "fit", "--executor", "slurm", "--time-min", "2", "--poll-s", "1", "--out", str(out),
                   *grid)
    assert "submitted 1 fit job as SLURM job " in done.stdout  # submitit submits one job as a plain job
    run = out / "full" / "s2"
    state = _state(run)
    assert state["state"] == "done" and state["restarts"] >= 1
    log = (run / "fit.log").read_text()
    assert log.count("$ ") == state["restarts"] + 1  # one sitting per requeue, each from the last checkpoint
    # SLURM may send its warning up to 60 s early (its event resolution), so a first sitting can end before it has
    # written a checkpoint; the next then starts afresh.
    resumed = log.count(f"Restoring states from the checkpoint path at {run / 'checkpoints' / 'last.ckpt'}")
    assert 1 <= resumed <= state["restarts"]
    _driver(TABLE1, slurm, "fit", "--out", str(tmp_path / "local"), *grid)
    assert _rows(TABLE1, out, slurm, tmp_path / "s.csv") == _rows(TABLE1, tmp_path / "local", slurm,
                                                                    tmp_path / "l.csv")
    assert _epochs_trained(run / "checkpoints" / "last.ckpt") == 59


@pytest.mark.parametrize("options, reason", [
    (["--partition", "gpu"], "invalid partition specified: gpu"),
    (["--cpus-per-job", "64"], "Requested node configuration is not available"),
    # the option took --wrap as its value and the reason was "For instance: #!/bin/sh"
    (["--sbatch", "account"], "(option '--account' requires an argument)"),
])
def test_jobs_the_cluster_would_not_take_are_refused_in_one_line_before_anything_is_written(slurm, tmp_path, options,
                                                                                          reason) -> None:
    refused = _driver(TABLE1, slurm, "all", "--executor", "slurm", *options, "--out", str(tmp_path / "grid"),
                      "--seeds", "0", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and reason in refused.stderr
    assert refused.stderr.startswith("mmca_avmnist_table1.py: error: SLURM would not take the grid's jobs (")
    assert not (tmp_path / "grid").exists()

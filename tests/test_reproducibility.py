"""Runs reproduce as a user runs them: ``python -m lit_icl fit`` in a subprocess, default thread count.

1. Two runs of the same config and seed end with bit-identical weights and optimizer state.
2. A run killed with SIGKILL in the middle of an epoch and restarted with ``--ckpt_path last`` ends bit-identical
   to the uninterrupted run.
3. (``slow``) A run stopped by SIGTERM (a preemption) in the middle of an epoch exits with status 143, having saved
   ``last.ckpt`` at the step it reached, and resumed from it ends bit-identical to the uninterrupted run.

The batch is large enough (128 episodes x 20 points) for the class-embedding lookup of the GD head to take
PyTorch's multi-threaded scatter-add path in backward, whose summation order varies from run to run; without
``trainer.deterministic`` (the CLI's default) both comparisons fail at 2 threads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from icssl.helpers import tiny_args

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
STEPS_PER_EPOCH = 3
EPOCHS = 3


def fit(root: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python -m lit_icl fit`` on the tiny IC-SSL config with 128-episode batches, in a fresh process."""
    args = tiny_args(
        root,
        "--seed_everything", "7",
        "--trainer.max_epochs", str(EPOCHS),
        "--data.init_args.batch_size", "128",
        "--data.init_args.chunk_size", "16",
        "--data.init_args.eval_batch_size", "16",
        "--data.init_args.train_batches_per_epoch", str(STEPS_PER_EPOCH),
        *extra,
        name="repro",
    )
    # The user's environment, minus any thread pinning, plus the tests folder for the kill callback.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "lit_icl", "fit", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False,
        timeout=600,
    )


def last_ckpt(root: Path) -> dict:
    return torch.load(root / "runs/repro/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] == STEPS_PER_EPOCH * EPOCHS
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), f"weights differ in {key}"
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        for key in sa:
            assert torch.equal(sa[key], sb[key]), f"optimizer state {key} differs"


KILL_STEP = STEPS_PER_EPOCH * (EPOCHS - 1) + 2  # second step of the last epoch
TERM_STEP = STEPS_PER_EPOCH * (EPOCHS - 1) + 1  # first step of the last epoch


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every process the default tests below compare: the two uninterrupted runs and the one killed with SIGKILL,
    run side by side, then the killed run's resume. Each process spends most of its seconds importing on one core,
    so the first round takes little more than its slowest process. ``last.ckpt``'s step is read right after the
    kill, before the resume writes over it."""
    roots = {name: tmp_path_factory.mktemp(name) for name in ("straight", "again", "killed")}
    kill = f'[{{"class_path": "subprocess_callbacks.KillAtStep", "init_args": {{"step": {KILL_STEP}}}}}]'
    cuts = {"straight": (), "again": (), "killed": ("--trainer.callbacks", kill)}
    with ThreadPoolExecutor(max_workers=len(cuts)) as pool:
        first = dict(zip(cuts, pool.map(lambda name: fit(roots[name], *cuts[name]), cuts)))
    last = roots["killed"] / "runs/repro/version_0/checkpoints/last.ckpt"
    at_cut = {"killed": torch.load(last, map_location="cpu", weights_only=False)["global_step"]} if last.is_file() else {}
    resumed = {"killed": fit(roots["killed"], "--ckpt_path", "last")}
    return {"roots": roots, "first": first, "at_cut": at_cut, "resumed": resumed}


@pytest.fixture(scope="module")
def straight(runs: dict) -> dict:
    proc = runs["first"]["straight"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_ckpt(runs["roots"]["straight"])


def test_same_seed_gives_bit_identical_weights(runs: dict, straight: dict) -> None:
    again = runs["first"]["again"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert_bit_identical(straight, last_ckpt(runs["roots"]["again"]))


def test_sigkill_mid_epoch_then_resume_ends_bit_identical(runs: dict, straight: dict) -> None:
    proc = runs["first"]["killed"]
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    # What survived the kill is the checkpoint of the last finished epoch.
    assert runs["at_cut"]["killed"] == STEPS_PER_EPOCH * (EPOCHS - 1)
    proc = runs["resumed"]["killed"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = runs["roots"]["killed"]
    assert sorted(p.name for p in (root / "runs/repro").iterdir()) == ["version_0"]
    assert_bit_identical(straight, last_ckpt(root))


# Two more processes, one after the other (about 12 s of a 2-core machine's time: each spends most of its seconds
# importing). What it checks, the default suite checks elsewhere: the status 143, the line, the ranks' record and
# last.ckpt at the step a SIGTERM stopped a fresh ``python -m lit_icl`` process inside an epoch in
# tests/test_ddp_stop.py::test_ddp_ranks_stop_after_the_same_step_when_rank_1_gets_sigterm; the same stop in one
# process (status, line, last.ckpt's step) in tests/callbacks/test_interrupt.py::
# test_a_stop_after_a_checkpoint_says_to_resume_with_a_config_s_own_best_model_callback; a run stopped there by that
# path (RunCheckpoint's save at the stop, as for Ctrl-C) resumed to an uninterrupted run's weights in
# test_ctrl_c_stops_after_the_step_saves_it_and_the_resumed_run_ends_as_an_uninterrupted_one; and a fresh process
# at the default thread count resumed to them bit for bit in test_sigkill_mid_epoch_then_resume_ends_bit_identical.
@pytest.mark.slow
def test_sigterm_mid_epoch_saves_that_step_and_resume_ends_bit_identical(tmp_path, straight: dict) -> None:
    record = tmp_path / "ends.txt"
    term = (f'[{{"class_path": "subprocess_callbacks.SignalAtStep", '
            f'"init_args": {{"step": {TERM_STEP}, "rank": 0, "path": "{record}"}}}}]')
    proc = fit(tmp_path, "--trainer.callbacks", term)
    # Not 0 (Lightning's own status for it): a scheduler or a grid driver must not count the run as finished.
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-3000:])
    assert "lit_icl: stopped by SIGTERM; resume with --ckpt_path last" in proc.stderr
    assert record.read_text().split() == ["0", "SIGTERMException", str(TERM_STEP)]
    assert last_ckpt(tmp_path)["global_step"] == TERM_STEP  # saved where it stopped, not at the last epoch's end
    proc = fit(tmp_path, "--ckpt_path", "last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_bit_identical(straight, last_ckpt(tmp_path))


@pytest.mark.slow  # three inductor runs in their own processes: 101 s on 2 cores (2026-11-27), 43 s since graphs are cached
def test_a_compiled_run_killed_and_resumed_ends_bit_identical_to_a_compiled_run(tmp_path: Path) -> None:
    """Exact resume holds under ``--compile.mode default`` too (inductor's kernels are deterministic on the CPU):
    killed mid-epoch and resumed, a compiled run ends bit-identical to an uninterrupted compiled run. The later
    runs read the graphs the first compiled back from the compile caches (inductor's and AOTAutograd's), so the
    resumed run's graphs are cached ones."""
    inductor = ("--compile.mode", "default")
    proc = fit(tmp_path / "straight", *inductor)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kill = f'[{{"class_path": "subprocess_callbacks.KillAtStep", "init_args": {{"step": {STEPS_PER_EPOCH + 2}}}}}]'
    proc = fit(tmp_path / "killed", *inductor, "--trainer.callbacks", kill)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    proc = fit(tmp_path / "killed", *inductor, "--ckpt_path", "last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled" in proc.stderr + proc.stdout
    assert_bit_identical(last_ckpt(tmp_path / "straight"), last_ckpt(tmp_path / "killed"))

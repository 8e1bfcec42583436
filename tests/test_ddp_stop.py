"""DDP ranks agree to stop (SIGTERM, ``max_time``) on the host (:mod:`lit_icl.callbacks.ddp_stop`).

With Lightning 2.6.6's own handling, a SIGTERM to either of 2 gloo ranks often ended the run with the other rank
failing in a collective ("Connection closed by peer"), and every training batch made two broadcasts that on a GPU
read back from the device; the CLI runs below stop both ranks after the same step and make none.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from icssl.helpers import tiny_args
from lightning.pytorch import Trainer
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from lit_icl.callbacks import StopTogether
from lit_icl.callbacks.ddp_stop import StopVote

TESTS = Path(__file__).resolve().parent


def _vote_worker(rank: int, store_path: str, asks_at: int | None, polls: int, out: mp.Queue) -> None:
    """One rank: ``polls`` polls, raising its first flag from poll ``asks_at`` on (never if ``None``) and its second
    at poll 1 only on rank 1; reports the polls' verdicts."""
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        vote = StopVote(dist.new_group(backend="gloo"), flags=2)
        verdicts = []
        for i in range(polls):
            first, second = vote.poll(asks_at is not None and i >= asks_at, rank == 1 and i == 1)
            verdicts.append((first, second))
            if first:
                break
        vote.close()
        out.put((rank, verdicts))
    finally:
        dist.destroy_process_group()


def _vote(tmp_path: Path, asks: dict[int, int]) -> dict[int, list[tuple[bool, bool]]]:
    """Both ranks' verdicts, with rank ``r`` asking to stop from poll ``asks[r]`` on."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_vote_worker, args=(r, str(tmp_path / "store"), asks.get(r), 6, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("asks", [{0: 2}, {1: 2}, {0: 3, 1: 2}, {}], ids=["rank0", "rank1", "both", "none"])
def test_the_vote_gives_every_rank_the_same_verdict_at_the_same_poll(tmp_path, asks) -> None:
    """Whichever rank raises a flag at poll ``k``, every rank reads it at poll ``k + 1`` (the reduction started at
    one poll is read at the next), each flag on its own; no flag is read that no rank raised."""
    verdicts = _vote(tmp_path, asks)
    assert verdicts[0] == verdicts[1]
    seconds = [second for _, second in verdicts[0]]
    assert seconds == [False, False, True, False, False, False][: len(seconds)]  # rank 1's at poll 1 only
    firsts = [first for first, _ in verdicts[0]]
    if asks:
        k = min(asks.values())
        assert firsts == [False] * (k + 1) + [True]
    else:
        assert firsts == [False] * 6


def test_a_poll_takes_one_flag_per_reason() -> None:
    with pytest.raises(ValueError, match="takes 2 flags, got 1"):
        StopVote(group=None, flags=2).poll(True)


def test_lightning_still_has_what_the_callback_replaces() -> None:
    """The callback shadows two private methods of Lightning 2.6; if Lightning renames them, DDP runs silently go
    back to Lightning's broadcast: this fails first."""
    assert callable(getattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor", None))
    assert callable(getattr(_SignalConnector, "_sigterm_notifier_fn", None))


def test_a_single_process_run_keeps_lightnings_handling() -> None:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    callback = StopTogether()
    assert StopTogether.replaces_lightnings(trainer)  # Lightning has what it replaces, but one process needs none
    callback.setup(trainer, None, "fit")
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)
    assert "_sigterm_notifier_fn" not in vars(trainer._signal_connector)


def _two_rank_args(tmp_path: Path, callbacks: str, *extra: str, batches: int = 20) -> list[str]:
    """A tiny IC-SSL fit on 2 gloo ranks with ``batches`` steps per epoch and the callbacks given (a JSON list)."""
    return tiny_args(tmp_path, "--model.init_args.lr_schedule", "constant", "--data.init_args.batch_size", "8",
                     "--data.init_args.eval_batch_size", "8", "--data.init_args.train_batches_per_epoch", str(batches),
                     "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
                     "--trainer.callbacks", callbacks, *extra)


def _rank_env(**extra: str) -> dict[str, str]:
    """The environment of a rank's process: one thread each (two ranks share 2 cores), unbuffered output, the tests
    folder on the path for the test callbacks, and ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **extra}


def _two_rank_fit(tmp_path: Path, callbacks: str, *extra: str, batches: int = 20) -> subprocess.CompletedProcess:
    """:func:`_two_rank_args` run as one ``python -m lit_icl fit``, which starts its second rank itself."""
    return subprocess.run([sys.executable, "-m", "lit_icl", "fit", *_two_rank_args(tmp_path, callbacks, *extra,
                                                                                  batches=batches)],
                          env=_rank_env(), capture_output=True, text=True, check=False, timeout=300)


def _lines(path: Path) -> list[list[str]]:
    return sorted(line.split() for line in path.read_text().splitlines()) if path.exists() else []


def _fit_and_signal(tmp_path: Path, rank: int | None,
                    signum: str = "SIGTERM") -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """The 2-rank fit whose rank ``rank`` (each rank if ``None``) gets ``signum`` after step 5 of a 20-step epoch,
    and how each rank ended."""
    record = tmp_path / "ends.txt"
    callback = json.dumps([{"class_path": "subprocess_callbacks.SignalAtStep",
                            "init_args": {"step": 5, "rank": rank, "path": str(record), "signum": signum}}])
    return _two_rank_fit(tmp_path, callback), _lines(record)


def _assert_stopped_together(proc: subprocess.CompletedProcess, ends: list[list[str]], root: Path,
                             signum: int = signal.SIGTERM, name: str = "SIGTERM") -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 128 + signum, output[-3000:]
    # The signal came after step 5: the vote started at step 6's start is read at step 7's, on both ranks.
    assert ends == [["0", "SIGTERMException", "6"], ["1", "SIGTERMException", "6"]], output[-3000:]
    assert f"{name} received: all 2 ranks stop after step 6" in output
    assert "Traceback" not in output and "Connection closed" not in output, output[-3000:]
    assert output.count(f"lit_icl: stopped by {name}; resume with --ckpt_path last") == 1  # rank 0 says it
    ckpt = torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 6  # saved where the ranks stopped (the epoch's own checkpoint comes at 20)


def test_ddp_ranks_stop_after_the_same_step_when_rank_1_gets_sigterm(tmp_path) -> None:
    """Rank 1 alone is signalled (what a node's eviction looks like to the ranks of another node)."""
    _assert_stopped_together(*_fit_and_signal(tmp_path, rank=1), tmp_path)


@pytest.mark.slow  # 12 s more of two processes; the rank-1 case stays in the default suite
def test_ddp_ranks_stop_after_the_same_step_when_rank_0_gets_sigterm(tmp_path) -> None:
    _assert_stopped_together(*_fit_and_signal(tmp_path, rank=0), tmp_path)


@pytest.mark.slow  # 12 s more of two processes; the rank-1 SIGTERM case stays in the default suite
def test_ddp_ranks_stop_after_the_same_step_with_a_checkpoint_on_ctrl_c(tmp_path) -> None:
    """Ctrl-C at a terminal reaches every rank (they share its process group): each notes it, and the ranks stop
    together as for SIGTERM, saving ``last.ckpt``; the command exits 130."""
    _assert_stopped_together(*_fit_and_signal(tmp_path, rank=None, signum="SIGINT"), tmp_path,
                             signum=signal.SIGINT, name="Ctrl-C")


@pytest.mark.slow  # three 2-rank fits: about a minute
def test_ddp_stopped_by_max_time_and_resumed_ends_bit_identical(tmp_path) -> None:
    """A 2-rank run that the vote stops with ``--trainer.max_time`` inside its epoch, resumed with ``--ckpt_path
    last``, ends with the weights and optimizer state of the run that was not stopped."""

    def last(root: Path) -> dict:
        return torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)

    for root, extra in ((tmp_path / "straight", ()), (tmp_path / "cut", ("--trainer.max_time", "00:00:00:03")),
                        (tmp_path / "cut", ("--ckpt_path", "last"))):
        proc = _two_rank_fit(root, "[]", "--trainer.max_epochs", "1", *extra, batches=1500)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        if extra[:1] == ("--trainer.max_time",):
            assert 0 < last(root)["global_step"] < 1500
    straight, resumed = last(tmp_path / "straight"), last(tmp_path / "cut")
    assert straight["global_step"] == resumed["global_step"] == 1500
    assert all(torch.equal(straight["state_dict"][k], resumed["state_dict"][k]) for k in straight["state_dict"])
    a, b = (ckpt["optimizer_states"][0]["state"] for ckpt in (straight, resumed))
    assert all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])


@pytest.mark.parametrize("deferred", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["read", "deferred"])
def test_ddp_ranks_stop_together_when_one_ranks_loss_is_not_finite(tmp_path, deferred) -> None:
    """``FiniteGuard`` under DDP: rank 1's loss turns NaN; both ranks stop with the guard's error (status 2) instead
    of rank 0 failing in the gradient reduction (gloo) or waiting for its timeout (NCCL). ``deferred``: the loss
    read later, as on a GPU."""
    nan = ('[{"class_path": "subprocess_callbacks.NanOnRank", '
           f'"init_args": {{"step": 3, "rank": 1, "deferred": {str(deferred).lower()}}}}}]')
    proc = _two_rank_fit(tmp_path, nan)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "lit_icl: error: training loss is nan at step 3 (epoch 0, batch 3)" in output  # rank 1
    when = "by" if deferred else "at"
    assert f"the training loss was not finite on rank 1 {when} step 3 (epoch 0, batch 3); every rank stopped" in output
    assert "Connection closed" not in output, output[-3000:]
    assert not (tmp_path / "runs/tiny/version_0/checkpoints").exists()


def _srun_ranks(args: list[str], env: dict[str, str]) -> list[tuple[str, str, int]]:
    """Two ranks started as srun starts them, each a ``python -m lit_icl fit`` process of its own: each one's
    stdout, stderr and status."""
    procs = [subprocess.Popen([sys.executable, "-m", "lit_icl", "fit", *args],
                              env={**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        return [(*proc.communicate(timeout=120), proc.returncode) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()


@pytest.fixture(scope="module")
def srun_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same two srun-started ranks twice: first while another process holds the run folder's lock, then, once
    it is released, for a run that ``--trainer.max_time`` stops inside a long epoch (read by the two tests below,
    so that one pair of processes runs to the end for both)."""
    import fcntl
    import socket

    root = tmp_path_factory.mktemp("srun")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ends, counts = root / "ends.txt", root / "counts.txt"
    # SignalAtStep without a step only records how each rank's run ended.
    callbacks = (f'[{{"class_path": "subprocess_callbacks.SignalAtStep", "init_args": {{"path": "{ends}"}}}}, '
                 f'{{"class_path": "subprocess_callbacks.CountBroadcasts", "init_args": {{"path": "{counts}"}}}}]')
    args = _two_rank_args(root, callbacks, "--trainer.logger.init_args.version", "s0", "--trainer.max_time",
                          "00:00:00:04", batches=2000)
    folder = root / "runs" / "tiny" / "s0"
    folder.mkdir(parents=True)
    env = _rank_env(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_NODEID="0", SLURM_JOB_NAME="lit_icl",
                    SLURM_JOB_ID="4242", SLURM_NODELIST="127.0.0.1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's run
        refused = _srun_ranks(args, env)
        left = sorted(p.name for p in folder.iterdir())  # before the released run writes into it
    finally:
        os.close(fd)
    refused_ends = _lines(ends)
    ends.unlink(missing_ok=True)
    released = _srun_ranks(args, env)
    return {"folder": folder, "refused": refused, "left": left, "refused_ends": refused_ends, "released": released,
            "ends": _lines(ends), "counts": _lines(counts)}


def test_a_run_folder_in_use_stops_every_rank_that_srun_started(srun_runs: dict) -> None:
    """Under srun (or torchrun) every rank is a process of its own, and only rank 0 takes the run folder's lock.
    When the folder is in use, rank 0 passes its refusal on through the process group: both ranks end with the one
    line and status 2, and nothing is written. Before, rank 0 ended alone and rank 1 waited for the group's
    timeout (30 minutes)."""
    folder = srun_runs["folder"]
    line = (f"lit_icl: error: the run folder {folder} is in use by another lit_icl process (the same run started "
            "twice, or two runs given one --trainer.logger.init_args.version); wait for it to end, or give this run "
            "another version")
    for _, err, status in srun_runs["refused"]:
        assert status == 2, err[-3000:]
        assert err.strip().splitlines()[-1] == line, err[-3000:]
        assert "Traceback" not in err
    assert srun_runs["left"] == []
    assert srun_runs["refused_ends"] == [["0", "ConfigError", "0"], ["1", "ConfigError", "0"]]  # before any step
    # Released, the same two ranks run to the end: passing no refusal on costs a run nothing.
    for _, err, status in srun_runs["released"]:
        assert status == 0, err[-3000:]
    assert (folder / "checkpoints" / "last.ckpt").is_file()


def test_ddp_max_time_stops_both_ranks_after_the_same_step_with_no_broadcast_per_batch(srun_runs: dict) -> None:
    """``--trainer.max_time`` on 2 gloo ranks (the released run of ``srun_runs``): no training batch broadcasts
    (Lightning 2.6 broadcasts twice per batch: its SIGTERM flag and its Timer's verdict), and both ranks stop inside
    the epoch after the same step, which the last checkpoint records."""
    output = "".join(out + err for out, err, _ in srun_runs["released"])
    assert [status for _, _, status in srun_runs["released"]] == [0, 0], output[-3000:]
    assert srun_runs["counts"] == [["0", "0", "27"], ["1", "0", "27"]], output[-3000:]
    (rank0, rank1) = srun_runs["ends"]
    assert rank0[1:] == rank1[1:] and rank0[1] == "end", output[-3000:]
    step = int(rank0[2])
    assert 30 < step < 2000
    assert f"Time limit reached: all 2 ranks stop after step {step}" in output
    ckpt = torch.load(srun_runs["folder"] / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == step

"""Corrupted avMNIST through the CLI: a tiny fit + test end to end with Table 1's rows, resume, the bad-input table
and every shipped config at tiny size."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from badinput import assert_rejected
from mmca.avmnist.helpers import avmnist_args, write_layout
from mmca.helpers import config_id, experiment_configs

from lit_icl.cli import main
from lit_icl.core.nets import count_parameters
from lit_icl.mmca import (
    AVMNISTModule,
    MultimodalCrossAttention,
)

# ---------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def seeded_fit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny 2-epoch run of seed 5 on the 40-row layout under ``data/`` (``runs/tiny/version_0``), fitted once:
    the test below tests a copy of it and the resume test compares its resumed run with it (read only)."""
    tmp_path = tmp_path_factory.mktemp("seeded_fit")
    write_layout(tmp_path / "data", n_train=40, n_test=20, audio_side=28)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(Path(__file__).resolve().parents[3])  # the configs' paths are relative to the repository
        main(["fit", *avmnist_args(tmp_path, tmp_path / "data", "--seed_everything", "5")])
    return tmp_path


def test_tiny_fit_then_test_reports_table_1_rows(tmp_path: Path, seeded_fit: Path) -> None:
    shutil.copytree(seeded_fit, tmp_path, dirs_exist_ok=True)  # the test run writes into the run folder
    root = tmp_path / "data"
    ckpt = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    main(["test", *avmnist_args(tmp_path, root, "--seed_everything", "5"), "--ckpt_path", str(ckpt)])
    results = sorted(glob.glob(str(tmp_path / "runs" / "tiny" / "version_*" / "results.json")))
    rows = json.loads(Path(results[-1]).read_text())["rows"]
    by = {(r["metric"], r.get("epoch")): r for r in rows}
    assert by[("params", None)]["value"] == count_parameters(MultimodalCrossAttention(depth=1))
    history = [by[("test_accuracy", e)]["value"] for e in (1, 2)]
    assert by[("best_test_accuracy", None)]["value"] == max(history)
    assert by[("best_epoch", None)]["value"] == history.index(max(history)) + 1
    assert by[("epochs", None)]["value"] == 2
    assert all(r["method"] == "full" and r["noise_std"] == 0.2 and r["dataset"] == "data" for r in rows)
    # The last checkpoint's own accuracy is the last epoch's test accuracy (same fixed test corruption).
    assert by[("accuracy", None)]["value"] == pytest.approx(history[-1])
    model = AVMNISTModule.load_from_checkpoint(ckpt)
    assert model.test_history == history and isinstance(model.net, MultimodalCrossAttention)


BAD_ROWS = [
    (["--data.init_args.noise_std", "-1"], "noise_std=-1"),
    (["--data.init_args.noise_std", "1e300"], "noise_std=1e+300 must lie in [0, 1.67772e+07]; larger noise leaves no trace"),
    (["--data.init_args.audio_size", "100000"], "audio_size=100000 exceeds the 28x28 spectrograms under"),
    (["--data.init_args.val_size", "40"], "val_size=40 leaves no training rows"),
    (["--data.init_args.batch_size", "64"], "fewer than batch_size=64"),
    (["--model.init_args.net.init_args.heads", "3"], "d=16 must be divisible by heads=3"),
    (["--model.init_args.net.init_args.dropout", "1.5"], "dropout=1.5"),
    (["--model.init_args.net.init_args.dropout", "1.0"], "dropout=1.0 must lie in [0, 1); 0 means none"),
    (["--model.init_args.lr", "0"], "lr=0"),
    # every DDP rank scores batches of its own and needs one (8 validation rows in one batch of 10)
    (["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"],
     ("--data.init_args.eval_batch_size=10 makes the val split's 8 rows 1 batch, fewer than the 2 DDP ranks that "
      "share them; give at most 4")),
]


@pytest.mark.parametrize(("extra", "needle"), BAD_ROWS)
def test_bad_input_is_one_line_before_anything_is_written(tmp_path: Path, capsys, extra, needle) -> None:
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)
    assert_rejected(tmp_path, capsys, ["fit", *avmnist_args(tmp_path, root, *extra)], needle)


def test_a_test_with_fewer_batches_than_ddp_ranks_is_one_line(tmp_path: Path, capsys) -> None:
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "3", "--trainer.accelerator", "cpu"]
    assert_rejected(tmp_path, capsys, ["test", *avmnist_args(tmp_path, root, *ddp)],
                    "the test split's 20 rows 2 batches, fewer than the 3 DDP ranks that share them; give at most 6")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


#: (file under the layout root, how it is broken, needle): each a data file a user might hand over damaged.
BAD_FILES = [
    ("train_labels.npy", lambda p: p.write_bytes(b""), "train_labels.npy as a .npy array (it is empty)"),
    ("image/train_data.npy", _truncate, "cannot read"),
    ("audio/test_data.npy", _truncate, "audio/test_data.npy as a .npy array"),
    ("test_labels.npy", lambda p: p.write_text("0,1,2\n"), "test_labels.npy as a .npy array"),
    ("train_labels.npy", lambda p: np.save(p, np.array([object()] * 40)), "train_labels.npy as a .npy array"),
    ("image/train_data.npy", lambda p: np.save(p, np.zeros((40, 783))), "has shape (40, 783)"),
    ("image/test_data.npy", lambda p: np.save(p, np.zeros((19, 784))), "needs (20, 784)"),
    ("audio/train_data.npy", lambda p: np.save(p, np.zeros((40, 28, 27))), "square spectrograms"),
    ("audio/test_data.npy", lambda p: np.save(p, np.zeros((20, 784))), "has shape (20, 784)"),
    ("train_labels.npy", lambda p: np.save(p, np.r_[np.zeros(39, int), 10]), "row 39 is 10"),
    ("test_labels.npy", lambda p: np.save(p, np.full(20, -1)), "(20 of 20 rows outside 0..9)"),
    ("train_labels.npy", lambda p: np.save(p, np.full(40, 2.5)), "must hold digits 0..9"),
    ("train_labels.npy", lambda p: np.save(p, np.zeros((40, 1), int)), "non-empty 1-d array"),
    ("image/train_data.npy", lambda p: np.save(p, np.array(["x"] * 40)), "holds <U1 values"),
]


@pytest.mark.parametrize(("name", "damage", "needle"), BAD_FILES, ids=[f"{r[0]}:{r[2][:30]}" for r in BAD_FILES])
def test_a_broken_data_file_is_one_line_naming_it_before_anything_is_written(
    tmp_path: Path, capsys, name, damage, needle
) -> None:
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)
    damage(root / name)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    line = assert_rejected(tmp_path, capsys, ["fit", *avmnist_args(tmp_path, root)], needle)
    assert str(root / name) in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, "nothing written anywhere"


def test_missing_data_is_one_cli_line(tmp_path: Path, capsys) -> None:
    line = assert_rejected(
        tmp_path,
        capsys,
        ["fit", *avmnist_args(tmp_path, tmp_path / "absent")],
        "lit_icl.mmca.avmnist.build --out",
    )
    assert "avMNIST not found" in line


def test_resume_from_last_checkpoint_is_bit_identical(tmp_path: Path, seeded_fit: Path) -> None:
    """Fit 2 epochs straight (``seeded_fit``) vs 1 epoch, then `--ckpt_path last` to 2: same weights, optimizer state
    and history (training order and noise come from the EpochSampler index, not from a consumed RNG)."""
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)  # the same rows as seeded_fit's

    def run(name: str, epochs: int, *extra: str) -> None:
        main(
            [
                "fit",
                *avmnist_args(
                    tmp_path,
                    root,
                    "--trainer.logger.init_args.name",
                    name,
                    "--trainer.max_epochs",
                    str(epochs),
                    "--seed_everything",
                    "5",
                    *extra,
                ),
            ]
        )

    run("resumed", 1)
    run("resumed", 2, "--ckpt_path", str(tmp_path / "runs/resumed/version_0/checkpoints/last.ckpt"))
    ckpts = sorted(glob.glob(str(tmp_path / "runs/resumed/version_*/checkpoints/last.ckpt")))
    a = torch.load(seeded_fit / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=False)
    b = torch.load(ckpts[-1], weights_only=False)
    assert a["global_step"] == b["global_step"] == 4
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a["avmnist_test_history"] == b["avmnist_test_history"] and len(a["avmnist_test_history"]) == 2


@pytest.fixture(scope="module")
def uncut(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The last checkpoint of the two-epoch run of three batches that was not cut, fitted once for both ways of
    cutting below (when step checkpoints are saved changes no number the run trains, its dropout RNG included)."""
    tmp_path = tmp_path_factory.mktemp("uncut")
    write_layout(tmp_path / "data", n_train=56, n_test=20, audio_side=28)  # 48 training rows: 3 batches of 16
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(Path(__file__).resolve().parents[3])  # the configs' paths are relative to the repository
        main(["fit", *avmnist_args(tmp_path, tmp_path / "data", "--seed_everything", "5")])
    return torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=False)


@pytest.mark.parametrize(
    ("cut", "step", "checkpoint_every"),
    [("StopAtStep", 4, None),  # stopped after step 4 the way --trainer.max_time stops a run (it validates then)
     ("FailAtStep", 5, "2")],  # crashed after step 5, its last checkpoint written inside an epoch at step 4
)
def test_a_run_resumed_inside_an_epoch_ends_bit_identical(tmp_path: Path, uncut: dict, cut: str, step: int,
                                                          checkpoint_every: str | None) -> None:
    """Two epochs of three batches, cut inside the second, resumed with ``--ckpt_path last``: the weights, optimizer
    state and per-epoch test history of the run that was not cut. That needs the data position (the rest of the
    epoch, not the next one), the dropout RNG state each rank had at the cut (dropout is on: 0.1), and the
    validation round of a ``max_time`` stop replaced by the epoch's own."""
    root = tmp_path / "data"
    write_layout(root, n_train=56, n_test=20, audio_side=28)  # 48 training rows: 3 batches of 16
    every = ["--checkpoint.every_n_train_steps", checkpoint_every] if checkpoint_every else []

    def args(run: str, *extra: str) -> list[str]:
        return ["fit", *avmnist_args(tmp_path / run, root, "--seed_everything", "5", *every, *extra)]

    callback = f'[{{"class_path": "subprocess_callbacks.{cut}", "init_args": {{"step": {step}}}}}]'
    if cut == "FailAtStep":
        with pytest.raises((RuntimeError, SystemExit)):
            main(args("cut", "--trainer.callbacks", callback))
    else:
        main(args("cut", "--trainer.callbacks", callback))
    last = tmp_path / "cut/runs/tiny/version_0/checkpoints/last.ckpt"
    at_cut = torch.load(last, weights_only=False)
    assert at_cut["global_step"] == 4
    assert at_cut["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 1}]
    assert len(at_cut["avmnist_test_history"]) == (2 if cut == "StopAtStep" else 1)  # the stop validated
    main(args("cut", "--ckpt_path", "last"))
    a = uncut
    b = torch.load(last, weights_only=False)
    assert a["global_step"] == b["global_step"] == 6
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a["avmnist_test_history"] == b["avmnist_test_history"] and len(b["avmnist_test_history"]) == 2


@pytest.mark.slow  # three 2-rank fits in subprocesses: about a minute
def test_ddp_stopped_inside_an_epoch_and_resumed_ends_bit_identical(tmp_path: Path) -> None:
    """On 2 gloo ranks, each with its own dropout masks: a run stopped inside its second epoch and resumed ends with
    the weights of the run that was not stopped. The checkpoint holds both ranks' RNG states, gathered as it is
    written, and each rank takes its own back."""
    import os
    import subprocess
    import sys

    root = tmp_path / "data"
    write_layout(root, n_train=72, n_test=20, audio_side=28)  # 64 training rows: 4 batches, 2 per rank

    def fit(run: str, *extra: str) -> dict:
        # eval batches of 4: a batch of the 8 validation rows for each rank; the 20 test rows' 5 batches are shared 3:2
        args = avmnist_args(tmp_path / run, root, "--seed_everything", "5", "--trainer.strategy", "ddp",
                            "--trainer.devices", "2", "--trainer.accelerator", "cpu",
                            "--data.init_args.eval_batch_size", "4", *extra)
        tests = str(Path(__file__).resolve().parents[2])  # for the stop callback
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "lit_icl", "fit", *args], env=env, capture_output=True, text=True,
                              check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return torch.load(tmp_path / run / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=False)

    straight = fit("straight")
    stop = '[{"class_path": "subprocess_callbacks.StopAtStep", "init_args": {"step": 3}}]'
    at_cut = fit("cut", "--trainer.callbacks", stop)
    assert at_cut["global_step"] == 3 and at_cut["avmnist_dropout_rng"]["states"].shape[0] == 2
    assert not torch.equal(*at_cut["avmnist_dropout_rng"]["states"])  # each rank draws its own masks
    resumed = fit("cut", "--ckpt_path", "last")
    assert straight["global_step"] == resumed["global_step"] == 4
    assert all(torch.equal(straight["state_dict"][k], resumed["state_dict"][k]) for k in straight["state_dict"])
    assert straight["avmnist_test_history"] == resumed["avmnist_test_history"]


@pytest.mark.slow  # a fit, a test and a 2-rank test in subprocesses: about 40 s
def test_a_ddp_test_scores_each_row_once_and_matches_one_process(tmp_path: Path) -> None:
    """30 test rows in 3 batches of 10 on 2 gloo ranks: the accuracy is the one process's. Lightning's
    DistributedSampler would have scored the first batch a second time (0.150 instead of 0.167 on this data)."""
    import os
    import subprocess
    import sys

    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=30, audio_side=28)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cli(sub: str, run: str, *extra: str) -> Path:
        args = avmnist_args(tmp_path / run, root, "--seed_everything", "5", *extra)
        proc = subprocess.run([sys.executable, "-m", "lit_icl", sub, *args], env=env, capture_output=True,
                              text=True, check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The accuracies are synced by the metrics' compute(); logged without sync_dist, Lightning warned they were not.
        assert "sync_dist=True" not in proc.stderr
        return tmp_path / run / "runs/tiny/version_0"

    ckpt = str(cli("fit", "fit") / "checkpoints/last.ckpt")
    accuracy = {}
    for run, extra in (("one", []), ("ddp", ["--trainer.strategy", "ddp", "--trainer.devices", "2",
                                              "--trainer.accelerator", "cpu"])):
        rows = json.loads((cli("test", run, "--ckpt_path", ckpt, *extra) / "results.json").read_text())["rows"]
        accuracy[run] = next(r["value"] for r in rows if r["metric"] == "accuracy")
    assert accuracy["ddp"] == accuracy["one"]


@pytest.mark.parametrize("config", experiment_configs("avmnist"), ids=config_id)
def test_every_shipped_config_fits_and_tests_at_tiny_size(tmp_path: Path, config: list[str]) -> None:
    root = tmp_path / "data"
    write_layout(
        root, n_train=40, n_test=20, audio_side=112
    )  # avMNIST's stored audio size, resized by the reader
    args = avmnist_args(tmp_path, root, "--trainer.max_epochs", "1", config=config)
    main(["fit", *args])
    main(["test", *args, "--ckpt_path", str(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt")])
    rows = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["rows"]
    variant = Path(config[-1]).stem  # the overlay's name is the method of its rows
    assert {r["method"] for r in rows} == {"full" if len(config) == 1 else variant}
    assert {"params", "best_test_accuracy", "best_epoch", "accuracy", "test_accuracy"} <= {
        r["metric"] for r in rows
    }


#: The base config by absolute path: these runs start from an empty working folder.
CONFIG = str(Path(__file__).resolve().parents[3] / "configs/mmca/avmnist.yaml")


def test_a_stand_in_that_cannot_be_built_is_one_cli_line_naming_the_installs(tmp_path: Path, capsys,
                                                                              monkeypatch) -> None:
    from lit_icl.mmca.avmnist import build

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(build, "standin_needs", lambda: ["`pip install -e '.[standins]'`",
                                                         "`apt-get install -y espeak-ng flite`"])
    line = assert_rejected(tmp_path, capsys, ["fit", *avmnist_args(tmp_path, Path("data/avmnist_lite"), config=CONFIG)],
                           "needs `pip install -e '.[standins]'` and `apt-get install -y espeak-ng flite`")
    assert "avMNIST not found under data/avmnist_lite" in line


def test_build_standin_false_keeps_the_missing_data_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from lit_icl.mmca.avmnist import build

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(build, "build_standin", lambda out: pytest.fail("nothing may be built"))
    line = assert_rejected(
        tmp_path, capsys,
        ["fit", *avmnist_args(tmp_path, Path("data/avmnist_lite"), "--data.init_args.build_standin", "false",
                              config=CONFIG)],
        "lit_icl.mmca.avmnist.build --out data/avmnist_lite",
    )
    assert "avMNIST not found" in line


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_suite.py runs it)")
def test_two_seeded_gpu_fits_under_strict_deterministic_mode_end_bit_identical(tmp_path: Path) -> None:
    """``deterministic: true`` on a GPU: every op of the net has a deterministic CUDA kernel (the tokenizers'
    pooling included, `GridPool`), so nothing raises, and two runs of one seed end with the same weights."""
    root = tmp_path / "data"
    write_layout(root, n_train=40, n_test=20, audio_side=28)
    for name in ("a", "b"):
        main(["fit", *avmnist_args(tmp_path, root, "--trainer.logger.init_args.name", name, "--trainer.accelerator",
                                   "gpu", "--trainer.deterministic", "true", "--compile.mode", "off")])
    a, b = (torch.load(tmp_path / f"runs/{n}/version_0/checkpoints/last.ckpt", weights_only=False)["state_dict"]
            for n in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)

"""Paper-agnostic bad input of issue 30, through ``python -m lit_icl``: non-finite config values, trainer flags
Lightning refuses, output folders that cannot be written, malformed or empty YAML, ``--ckpt_path last|best``
with nothing to resume, checkpoints of another experiment, and a run whose loss stops being finite.

Every row of the table is one ``lit_icl: error:`` line, exit status 2, no traceback and no file created
(:func:`badinput.assert_rejected`); the rows fail before training, on a tiny CoQE regression config. The
training tests at the end run a few steps each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from badinput import ERROR_PREFIX, assert_rejected
from conftest import copy_runs
from coqe.regression.helpers import overlay, reg_args
from lightning.pytorch import LightningModule

from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.cli import main
from lit_icl.core.errors import TrainingDiverged

CONFIG = overlay("cpu")

#: YAML files a row may pass with ``--config {inputs}/<name>``.
YAML_INPUTS = {
    "nan_lr.yaml": "model:\n  init_args:\n    lr: .nan\n",
    "inf_clip.yaml": "trainer:\n  gradient_clip_val: .inf\n",
    "nan_in_list.yaml": "trainer:\n  limit_train_batches: -.inf\n",
    "malformed.yaml": "trainer:\n  max_steps: 3\n model: [\n",
    "tab.yaml": "trainer:\n\tmax_steps: 3\n",
    "empty.yaml": "",
    "comments_only.yaml": "# nothing but a comment\n",
    "list.yaml": "- model\n- data\n",
    "empty_trainer.yaml": "model:\n  init_args:\n    lr: 0.002\ntrainer:\n  # max_steps: 10\n",
    "empty_data.yaml": "data:\n",
}

#: (subcommand, extra args, needle); ``{inputs}`` becomes the folder holding YAML_INPUTS, ``{tmp}`` tmp_path.
ROWS: list[tuple[str, list[str], str]] = [
    # non-finite config values (YAML and command line)
    ("fit", ["--config", "{inputs}/nan_lr.yaml"], "model.init_args.lr=nan is not a finite number"),
    ("test", ["--config", "{inputs}/nan_lr.yaml"], "model.init_args.lr=nan is not a finite number"),
    ("fit", ["--config", "{inputs}/inf_clip.yaml"], "trainer.gradient_clip_val=inf is not a finite number"),
    ("fit", ["--config", "{inputs}/nan_in_list.yaml"], "trainer.limit_train_batches=-inf is not a finite number"),
    ("fit", ["--model.init_args.lr", "nan"], "--model.init_args.lr: nan is not a finite number; give a finite value"),
    ("fit", ["--model.init_args.lr=-inf"], "--model.init_args.lr: -inf is not a finite number"),
    ("test", ["--model.init_args.net.init_args.output_scale", "NaN"],
     "--model.init_args.net.init_args.output_scale: NaN is not a finite number"),
    ("fit", ["--model.init_args.lr", "inf"], "--model.init_args.lr: inf is not a finite number; give a finite value"),
    # precisions the module does not run in: they failed at the first step with a dtype mismatch, after the run
    # folder was written; 16-mixed on the CPU ran bf16-mixed while the records said 16-mixed
    ("fit", ["--trainer.precision", "bf16-true"],
     "--trainer.precision bf16-true: CoQERegressionModule runs in 32-true, bf16-mixed, 16-mixed (its step builds"),
    ("fit", ["--trainer.precision", "64-true"], "--trainer.precision 64-true: CoQERegressionModule runs in 32-true"),
    ("test", ["--trainer.precision", "16-mixed", "--trainer.accelerator", "cpu"],
     "--trainer.precision 16-mixed: fp16 mixed precision needs a GPU, and on this CPU Lightning would run bf16-mixed"),
    # predict where nothing predicts (IC-SSL's module and data do; tests/icssl/test_cli.py)
    ("predict", [], "predict: CoQERegressionModule has no predict_step, so there is nothing to predict; use test"),
    # a size no machine can hold: the allocator's failure came as 100 lines of jsonargparse's union errors
    ("fit", ["--model.init_args.net.init_args.max_points", "1000000000000000"],
     "GiB in one tensor): a size in the config is far too large for this machine; check the sizes"),
    # evaluation sets that DDP ranks cannot share evenly (reg_args: 8 prompts = 2 chunks of 4 per set)
    ("test", ["--trainer.strategy", "ddp", "--trainer.devices", "3", "--trainer.accelerator", "cpu"],
     ("--data.init_args.test_prompts=8 is 2 chunks of 4, which 3 ranks cannot share evenly (Lightning's "
     "DistributedSampler would score 1 of them twice); give a multiple of 12, e.g. 12")),
    ("fit", ["--trainer.strategy", "ddp", "--trainer.devices", "3", "--trainer.accelerator", "cpu"],
     "--data.init_args.val_prompts=8 is 2 chunks of 4, which 3 ranks cannot share evenly"),
    # seeds outside numpy's range (Lightning raises a bare ValueError)
    ("fit", ["--seed_everything", "-3"], "--seed_everything=-3 must be from 0 to 4294967295"),
    ("test", ["--seed_everything", "4294967296"], "--seed_everything=4294967296 must be from 0 to 4294967295"),
    # trainer flags Lightning refuses
    ("fit", ["--trainer.precision", "8"], "--trainer.precision: 8 is not a precision; use one of 64, 32, 16"),
    ("test", ["--trainer.precision", "bf16_mixed"], "bf16-mixed"),
    ("fit", ["--trainer.val_check_interval", "0"], "--trainer.val_check_interval=0 must be > 0"),
    ("fit", ["--trainer.val_check_interval", "3"],  # reg_args: 2 training batches per epoch
     ("--trainer.val_check_interval=3 is longer than an epoch (2 training batches); give at most 2, or add "
     "--trainer.check_val_every_n_epoch null")),
    ("fit", ["--trainer.accumulate_grad_batches", "0"], "--trainer.accumulate_grad_batches=0 must be >= 1"),
    ("fit", ["--trainer.check_val_every_n_epoch", "0"], "--trainer.check_val_every_n_epoch=0 must be >= 1"),
    ("fit", ["--trainer.log_every_n_steps", "-1"], "--trainer.log_every_n_steps=-1 must be >= 0"),
    ("fit", ["--trainer.num_sanity_val_steps", "-3"], "--trainer.num_sanity_val_steps=-3 must be >= -1"),
    ("fit", ["--checkpoint.save_top_k", "-5"], "invalid checkpoint configuration: Invalid value for save_top_k=-5"),
    ("fit", ["--checkpoint.every_n_epochs", "-1"], "fix that --checkpoint option"),
    ("fit", ["--trainer.devices", "0"], "invalid trainer configuration: `Trainer(devices='0')`"),
    ("fit", ["--trainer.num_nodes", "0"], "`num_nodes` must be a positive integer, but got 0"),
    ("fit", ["--trainer.strategy", "nonsense"], "invalid strategy name: `strategy='nonsense'`"),
    ("fit", ["--trainer.max_steps", "-5"], "`max_steps` must be a non-negative integer or -1"),
    ("fit", ["--trainer.limit_val_batches", "-1"], "invalid value -1 for limit_val_batches"),
    # an --lr_scheduler without --optimizer: LightningCLI ignored it, trained with the module's own optimizer and
    # recorded the scheduler in config.yaml
    ("fit", ["--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"],
     ("--lr_scheduler torch.optim.lr_scheduler.StepLR is used only with --optimizer (the two replace the module's "
      "own optimizer and schedule), so alone it would be ignored: add an optimizer")),
    # ReduceLROnPlateau on a metric the module does not log: a traceback at the first validation's end, after the
    # run folder was written
    ("fit", ["--optimizer", "torch.optim.SGD", "--lr_scheduler", "ReduceLROnPlateau", "--lr_scheduler.monitor",
             "val/acc"],
     ("--lr_scheduler lightning.pytorch.cli.ReduceLROnPlateau monitors 'val/acc', which CoQERegressionModule does "
      "not log; it logs val/mse: set --lr_scheduler.monitor to one of those")),
    # a class named for a union option (optimizer or plateau scheduler, a logger or list of loggers, callbacks):
    # the message showed the union's last alternative ("does not correspond to a subclass of ReduceLROnPlateau",
    # "Expected a <class 'bool'>. Got value: [<both loggers>]"), not what was wrong with the class given
    ("fit", ["--optimizer", "torch.optim.SGD", "--lr_scheduler", "torch.optim.lr_scheduler.StepLR"],
     "--lr_scheduler: the following arguments are required: step_size (in torch.optim.lr_scheduler.StepLR)"),
    ("fit", ["--trainer.logger", "lightning.pytorch.loggers.CSVLoger"],
     "--trainer.logger: module 'lightning.pytorch.loggers' has no attribute 'CSVLoger'"),
    ("fit", ["--trainer.logger+=lightning.pytorch.loggers.CSVLogger"],
     "--trainer.logger: the following arguments are required: save_dir (in lightning.pytorch.loggers.CSVLogger)"),
    ("fit", ["--trainer.callbacks+=lit_icl.callbacks.HostReadCensus", "--trainer.callbacks.warmpu", "1"],
     "--trainer.callbacks: Option 'warmpu' is not accepted (in lit_icl.callbacks.HostReadCensus)"),
    # the host-read census (lit_icl.callbacks.HostReadCensus)
    ("fit", ["--trainer.callbacks+=lit_icl.callbacks.HostReadCensus", "--trainer.callbacks.warmup", "-1"],
     "HostReadCensus warmup=-1 must be >= 0"),
    ("test", ["--trainer.limit_test_batches", "-1"], "invalid value -1 for limit_test_batches"),
    # output folders that cannot be created
    ("fit", ["--trainer.logger.init_args.save_dir", "{inputs}/empty.yaml/runs"], "is a file, not a folder"),
    ("test", ["--trainer.logger.init_args.save_dir", "{inputs}/empty.yaml/runs"], "is a file, not a folder"),
    # malformed, empty and non-mapping config files: named, with the line
    ("fit", ["--config", "{inputs}/malformed.yaml"], "malformed.yaml is not valid YAML at line 3, column 2"),
    ("fit", ["--config", "{inputs}/tab.yaml"], "tab.yaml is not valid YAML at line 2"),
    ("fit", ["--config", "{inputs}/empty.yaml"], "empty.yaml is empty"),
    ("test", ["--config", "{inputs}/comments_only.yaml"], "comments_only.yaml is empty"),
    ("fit", ["--config", "{inputs}/empty_trainer.yaml"],
     "empty_trainer.yaml: `trainer:` at line 4 is empty, which would unset the trainer of the configs before it"),
    ("test", ["--config", "{inputs}/empty_data.yaml"], "empty_data.yaml: `data:` at line 1 is empty"),
    ("fit", ["--config={inputs}/list.yaml"], "list.yaml holds a YAML sequence at its top level"),
    # --ckpt_path with nothing behind it
    ("fit", ["--ckpt_path", "last"], "--ckpt_path last: no earlier run of this config (looked for {tmp}/runs/tiny"),
    ("test", ["--ckpt_path", "last"], "--ckpt_path last: no earlier run of this config"),
    ("validate", ["--ckpt_path", "last"], "--ckpt_path last: no earlier run of this config"),
    ("fit", ["--ckpt_path", "best"], "--ckpt_path best: no best checkpoint of this config"),
    ("test", ["--ckpt_path", "best"], "--ckpt_path best: no best checkpoint of this config"),
    ("fit", ["--ckpt_path", "last", "--trainer.logger.init_args.version", "3"], "looked for {tmp}/runs/tiny/version_3"),
    ("fit", ["--ckpt_path", "last", "--checkpoint.dirpath", "{tmp}/ck"], "looked for {tmp}/ck/last.ckpt"),
    ("test", ["--ckpt_path", "{inputs}"], "is a folder, not a checkpoint file; pass a .ckpt file (e.g. {inputs}/other_"),
    ("fit", ["--ckpt_path", "{inputs}/../"], "is a folder, not a checkpoint file; pass a .ckpt file (e.g. {inputs}/../inputs/other_"),
    ("test", ["--ckpt_path", "{inputs}/other_experiment.ckpt"], "was written by another experiment"),
    ("fit", ["--ckpt_path", "{inputs}/other_data.ckpt"], "lit_icl.mmca.LatentFactorDataModule"),
]
if not torch.cuda.is_available():
    ROWS.append(("fit", ["--trainer.accelerator", "gpu"], "use --trainer.accelerator auto"))


def _fake_ckpt(path: Path, module: str, data: str) -> None:
    """A Lightning-shaped checkpoint whose recorded classes are ``module`` and ``data`` (no weights needed:
    the class check comes first)."""
    torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": module, "lr": 1e-3},
                "datamodule_hyper_parameters": {"_class_path": data}}, path)


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "inputs"
    folder.mkdir()
    for name, text in YAML_INPUTS.items():
        (folder / name).write_text(text)
    _fake_ckpt(folder / "other_experiment.ckpt", "lit_icl.mmca.LatentFactorICLModule", "lit_icl.mmca.LatentFactorDataModule")
    _fake_ckpt(folder / "other_data.ckpt", "lit_icl.coqe.CoQERegressionModule", "lit_icl.mmca.LatentFactorDataModule")
    return folder


def _fill(items: list[str], inputs: Path, tmp_path: Path) -> list[str]:
    return [a.replace("{inputs}", str(inputs)).replace("{tmp}", str(tmp_path)) for a in items]


@pytest.mark.parametrize(("sub", "extra", "needle"), ROWS, ids=[f"{r[0]}:{' '.join(r[1])[:50]}" for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, inputs, sub, extra, needle) -> None:
    args = [sub, *reg_args(tmp_path, CONFIG), *_fill(extra, inputs, tmp_path)]
    assert_rejected(tmp_path, capsys, args, _fill([needle], inputs, tmp_path)[0])


@pytest.mark.parametrize("extra", [["--trainer.val_check_interval", "2"],
                                   ["--trainer.val_check_interval", "3", "--trainer.check_val_every_n_epoch", "null"],
                                   ["--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "0"]])
def test_a_validation_interval_of_an_epoch_or_across_epochs_runs(tmp_path, extra) -> None:
    """The refusal above stops at Lightning's own limit: an interval of a whole epoch, one that spans epochs when
    validation does not wait for epochs, or any interval with validation off, trains."""
    main(["fit", *reg_args(tmp_path, CONFIG), *extra])
    assert list((tmp_path / "runs").rglob("last.ckpt"))


def test_a_read_only_output_folder_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch) -> None:
    """``os.access`` says what a non-root user would hear (the tests may run as root, who may write anywhere)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == locked else real_access(p, mode, **kw))
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG),
                                              "--trainer.logger.init_args.save_dir", str(locked / "runs")],
                           f"--trainer.logger.init_args.save_dir {locked / 'runs'}: {locked} is not writable")
    assert "choose a folder you can write to" in line


def test_a_read_only_run_name_folder_is_refused_too(tmp_path, capsys, monkeypatch) -> None:
    """The run writes into save_dir/<name>/version_N: a writable save_dir whose <name> folder is not is refused."""
    save_dir = tmp_path / "out"
    (save_dir / "reg").mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode, **kw: False if Path(p) == save_dir / "reg" else real_access(p, mode, **kw))
    assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG), "--trainer.logger.init_args.save_dir",
                                       str(save_dir), "--trainer.logger.init_args.name", "reg"],
                    f"--trainer.logger.init_args.save_dir {save_dir}: {save_dir / 'reg'} is not writable")


def test_an_output_folder_on_a_full_disk_is_one_line_exit_74_before_anything_is_written(tmp_path, capsys,
                                                                                        monkeypatch) -> None:
    """TensorBoard left an empty ``version_0/`` with a 0-byte events file and a traceback; a full disk is the
    environment's failure, not bad input, so its status is 74 (``EXIT_STORAGE``), not 2."""
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(3 << 20, 3 << 20, 0))
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG)],
                           f"--trainer.logger.init_args.save_dir {tmp_path / 'runs'}: the disk of {tmp_path} is full "
                           "(0 bytes free)", status=74)
    assert line.endswith("free space there, or choose a folder on another disk")


def test_a_checkpoint_of_another_experiment_names_both_and_the_config_that_wrote_it(tmp_path, capsys, inputs) -> None:
    run = tmp_path / "old" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("# the config of the run that wrote it\n")
    _fake_ckpt(run / "checkpoints" / "last.ckpt", "lit_icl.mmca.LatentFactorICLModule",
               "lit_icl.mmca.LatentFactorDataModule")
    for sub, verb in (("test", "test it"), ("fit", "resume it")):
        line = assert_rejected(tmp_path, capsys, [sub, *reg_args(tmp_path, CONFIG), "--ckpt_path",
                                                  str(run / "checkpoints" / "last.ckpt")], "another experiment")
        assert "(lit_icl.mmca.LatentFactorICLModule with lit_icl.mmca.LatentFactorDataModule)" in line
        assert "this config builds lit_icl.coqe.CoQERegressionModule with lit_icl.coqe.RegressionDataModule" in line
        assert f"{verb} with --config {run / 'config.yaml'}" in line


def test_a_folder_without_checkpoints_says_where_a_fit_writes_them(tmp_path, capsys) -> None:
    (tmp_path / "nothing_here").mkdir()
    assert_rejected(tmp_path, capsys, ["test", *reg_args(tmp_path, CONFIG), "--ckpt_path", str(tmp_path / "nothing_here")],
                    "it holds none; a fit writes runs/<name>/version_N/checkpoints/last.ckpt")


def test_an_old_class_path_of_the_same_class_is_not_another_experiment(tmp_path) -> None:
    """Checkpoints written before a module moved record its old (aliased) path; the check compares classes."""
    from jsonargparse import Namespace

    from lit_icl.cli import check_ckpt_classes

    ckpt = {"hyper_parameters": {"_class_path": "lit_icl.coqe.regression_module.CoQERegressionModule"},
            "datamodule_hyper_parameters": {"_class_path": "lit_icl.coqe.regression_data.RegressionDataModule"}}
    config = Namespace(model=Namespace(class_path="lit_icl.coqe.CoQERegressionModule"),
                       data=Namespace(class_path="lit_icl.coqe.RegressionDataModule"))
    check_ckpt_classes(tmp_path / "x.ckpt", ckpt, config)  # no error


# ------------------------------------------------------------------ a checkpoint against the config
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny fitted regression run (width 16, lr 3e-4) under ``<folder>/runs/tiny/version_0``."""
    folder = tmp_path_factory.mktemp("trained")
    main(["fit", *reg_args(folder, CONFIG)])
    return folder


@pytest.mark.parametrize(("sub", "ckpt"), [("test", "last"), ("test", "file"), ("fit", "last")])
def test_a_setting_the_checkpoint_would_silently_replace_is_refused(tmp_path, capsys, trained, sub, ckpt) -> None:
    """LightningCLI rebuilds the model from the checkpoint's hyper-parameters, so ``--...width 32`` on a width-16
    checkpoint would be ignored (``test``) or fail to load (``fit --ckpt_path last``): refused, naming both."""
    copy_runs(trained, tmp_path)
    path = "last" if ckpt == "last" else str(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt")
    args = [sub, *reg_args(tmp_path, CONFIG, "--model.init_args.net.init_args.width", "32"), "--ckpt_path", path]
    line = assert_rejected(tmp_path, capsys, args, "was trained with other model settings", runs_exist=True)
    assert "--model.init_args.net.init_args.width is 32 here but 16 in the checkpoint" in line
    assert f"--config {tmp_path / 'runs/tiny/version_0/config.yaml'}" in line


def test_every_disagreeing_setting_is_counted(tmp_path, capsys, trained) -> None:
    copy_runs(trained, tmp_path)
    extra = ["--model.init_args.lr", "0.01", "--model.init_args.net.init_args.heads", "4",
             "--model.init_args.net.init_args.depth", "2", "--model.init_args.probe_points", "64"]
    line = assert_rejected(tmp_path, capsys, ["test", *reg_args(tmp_path, CONFIG, *extra), "--ckpt_path", "last"],
                           "(and 1 more)", runs_exist=True)
    assert "--model.init_args.lr is 0.01 here but 0.001 in the checkpoint" in line


# ------------------------------------------------------------------ a resume against the run it continues
def _files(run: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and modification time of every file of a run folder."""
    return {str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.rglob("*")) if p.is_file()}


def _assert_resume_refused(tmp_path, capsys, run: Path, args: list[str], needles: list[str]) -> None:
    """``args`` (a ``fit`` that resumes ``run``) is one line naming every needle and the two fixes, exit 2, and
    leaves the run's config.yaml and checkpoints as they were."""
    before = _files(run)
    line = assert_rejected(tmp_path, capsys, args, "which a resumed run cannot change", runs_exist=True)
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert f"resume with the run's own config (--config {run / 'config.yaml'}) or with the checkpoint's values" in line
    assert line.endswith("or start a new run without --ckpt_path")
    assert _files(run) == before


@pytest.mark.parametrize(("extra", "needles"), [
    (["--seed_everything", "7"], ["with another seed", "--seed_everything is 7 here but 0 in the run's config.yaml"]),
    (["--data.init_args.data_seed", "5"], ["with other data settings",
                                          "--data.init_args.data_seed is 5 here but 0 in the checkpoint"]),
    (["--data.init_args.batch_size", "16", "--data.init_args.val_prompts", "16", "--seed_everything", "3"],
     ["with another seed and other data settings", "--data.init_args.batch_size is 16 here but 8 in the checkpoint",
      "--data.init_args.val_prompts is 16 here but 8 in the checkpoint", "--seed_everything is 3 here but 0"]),
], ids=["seed", "data_seed", "batch+val+seed"])
@pytest.mark.parametrize("ckpt", ["last", "file"])
def test_a_resume_with_another_seed_or_other_data_is_refused(tmp_path, capsys, trained, extra, needles, ckpt) -> None:
    """Lightning builds the data module from the config and seeds as told, so these would train the rest of the run
    on other data (or noise) while the rewritten config.yaml says the whole run used them: refused, naming each."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    path = "last" if ckpt == "last" else str(run / "checkpoints/last.ckpt")
    args = ["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6", *extra), "--ckpt_path", path]
    _assert_resume_refused(tmp_path, capsys, run, args, needles)


@pytest.mark.parametrize(("extra", "needle"), [
    (["--trainer.max_steps", "3"], "has reached step 4, beyond --trainer.max_steps 3"),
    (["--trainer.max_steps", "-1", "--trainer.max_epochs", "1"], "has reached epoch 2, beyond --trainer.max_epochs 1"),
], ids=["max_steps", "max_epochs"])
def test_a_resume_shorter_than_the_checkpoint_is_refused(tmp_path, capsys, trained, extra, needle) -> None:
    """Lightning restored a 4-step checkpoint under max_steps 3, trained nothing, exited 0 and rewrote the run's
    config.yaml to say 3 steps. Refused, naming the length to give; the same length (a finished run) resumes."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    before = _files(run)
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG, *extra), "--ckpt_path", "last"],
                           needle, runs_exist=True)
    assert "the resume would train nothing" in line and "or more to go on, or `test` the checkpoint" in line
    assert _files(run) == before


def test_a_resume_to_the_checkpoints_own_length_is_no_refusal(tmp_path, trained) -> None:
    """The other side of the refusal above (once, not per row): the same length, a finished run, resumes."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    main(["fit", *reg_args(tmp_path, CONFIG), "--ckpt_path", "last"])  # max_steps 4, as trained: nothing to do
    assert torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 4


def test_a_resume_may_change_how_data_is_loaded_and_what_only_test_reads(tmp_path, trained) -> None:
    """Workers, the evaluation batch and the test set change no number the fit trains on: it resumes. A test (not
    a resume) of the checkpoint may use other data and another seed."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    # seed_everything true: Lightning seeds PL_GLOBAL_SEED or 0, the 0 the run's config.yaml holds.
    free = ["--data.init_args.num_workers", "1", "--data.init_args.eval_batch_size", "4",
            "--data.init_args.test_prompts", "16", "--data.init_args.shifts", "[id]", "--seed_everything", "true"]
    main(["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6", *free), "--ckpt_path", "last"])
    assert torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 6
    main(["test", *reg_args(tmp_path, CONFIG, "--data.init_args.data_seed", "5", "--seed_everything", "3"),
          "--ckpt_path", "last"])
    assert (tmp_path / "runs/tiny/version_1/results.json").is_file()


@pytest.mark.parametrize("ckpt", ["last", "file"])
def test_a_resume_on_another_number_of_ddp_ranks_is_refused(tmp_path, capsys, trained, ckpt) -> None:
    """``batch_size`` and the saved data position are per rank, so a 1-rank run resumed on 2 ranks would train on
    twice the batch, and on data the uninterrupted run never draws, while its config.yaml said the whole run did:
    refused before the ranks start, naming both counts. A test of the checkpoint is no resume and may use 2."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    assert torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)["training_ranks"] == 1
    path = "last" if ckpt == "last" else str(run / "checkpoints/last.ckpt")
    two = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    before = _files(run)
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6", *two),
                                              "--ckpt_path", path], "which a resumed run cannot change",
                           runs_exist=True)
    assert "was trained on 1 DDP rank and this run has 2" in line
    assert line.endswith("resume with --trainer.devices x --trainer.num_nodes = 1, or start a new run without --ckpt_path")
    assert _files(run) == before


def test_a_checkpoint_without_data_settings_or_run_config_resumes(tmp_path, trained) -> None:
    """A checkpoint of code that recorded no data hyper-parameters (nor its DDP ranks), away from its run's config.yaml, is not checked
    for what it lacks."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    ckpt = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    del ckpt["datamodule_hyper_parameters"], ckpt["datamodule_hparams_name"], ckpt["training_ranks"]
    legacy = tmp_path / "legacy.ckpt"
    torch.save(ckpt, legacy)
    main(["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6", "--seed_everything", "3"),
          "--ckpt_path", str(legacy)])
    assert torch.load(tmp_path / "runs/tiny/version_1/checkpoints/last.ckpt", map_location="cpu",
                      weights_only=True)["global_step"] == 6


SGD = ["--optimizer", "torch.optim.SGD", "--optimizer.lr", "0.1"]
STEP_LR = ["--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"]


@pytest.mark.parametrize(("extra", "needles"), [
    (SGD, ["with another optimizer or learning-rate scheduler",
           "--optimizer is 'torch.optim.SGD' here but None in the run's config.yaml"]),
    ([*SGD, *STEP_LR, "--data.init_args.data_seed", "5"],
     ["with other data settings and another optimizer or learning-rate scheduler",
      "--data.init_args.data_seed is 5 here but 0 in the checkpoint",
      "--optimizer is 'torch.optim.SGD' here but None in the run's config.yaml",
      "--lr_scheduler is 'torch.optim.lr_scheduler.StepLR' here but None in the run's config.yaml"]),
], ids=["optimizer", "data+optimizer+scheduler"])
def test_a_resume_with_another_optimizer_is_refused(tmp_path, capsys, trained, extra, needles) -> None:
    """The run trained with its module's Adam: resumed with ``--optimizer SGD``, Lightning loaded Adam's state into
    SGD and the first step failed with ``KeyError: 'momentum'``, after the run's config.yaml had been rewritten to say
    SGD. Refused, naming the option, before anything is written."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    args = ["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6", *extra), "--ckpt_path", "last"]
    _assert_resume_refused(tmp_path, capsys, run, args, needles)


def test_a_resume_with_another_learning_rate_or_schedule_of_its_own_optimizer_is_refused(tmp_path, capsys) -> None:
    """A run trained with ``--optimizer SGD --lr_scheduler StepLR``: Lightning restores both from the checkpoint, so
    another ``--optimizer.lr`` or ``step_size`` on resume was silently ignored while config.yaml said it was used;
    resumed without them, the module's Adam failed on SGD's state. The same options resume."""
    main(["fit", *reg_args(tmp_path, CONFIG, *SGD, *STEP_LR)])
    run = tmp_path / "runs/tiny/version_0"
    resume = ["fit", "--ckpt_path", "last", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6")]
    _assert_resume_refused(tmp_path, capsys, run, [*resume, *SGD[:-1], "0.2", *STEP_LR],
                           ["--optimizer.init_args.lr is 0.2 here but 0.1 in the run's config.yaml"])
    _assert_resume_refused(tmp_path, capsys, run, [*resume, *SGD, *STEP_LR[:-1], "2"],
                           ["--lr_scheduler.init_args.step_size is 2 here but 1 in the run's config.yaml"])
    _assert_resume_refused(tmp_path, capsys, run, resume,
                           ["--optimizer is None here but 'torch.optim.SGD' in the run's config.yaml",
                            "--lr_scheduler is None here but 'torch.optim.lr_scheduler.StepLR'"])
    main([*resume, *SGD, *STEP_LR])
    saved = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 6
    assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.1 * 0.1 ** 3)  # 3 epochs of 2


def test_an_icssl_resume_on_other_manifolds_is_refused(tmp_path, capsys) -> None:
    """The same on IC-SSL: other training (or validation) manifolds would be trained on from the resume on."""
    from icssl.helpers import tiny_args

    main(["fit", *tiny_args(tmp_path, "--trainer.max_steps", "2")])
    run = tmp_path / "runs/tiny/version_0"
    args = ["fit", *tiny_args(tmp_path, "--trainer.max_steps", "4", "--data.init_args.train_manifolds", "[sphere]"),
            "--ckpt_path", "last"]
    _assert_resume_refused(tmp_path, capsys, run, args,
                           ["--data.init_args.train_manifolds[0] is 'sphere' here but 'cylinder' in the checkpoint"])


def test_the_same_settings_resume_and_test(tmp_path, trained) -> None:
    """The check passes the config that wrote the checkpoint: resume to more steps, then test."""
    copy_runs(trained, tmp_path)
    main(["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6"), "--ckpt_path", "last"])
    ckpts = tmp_path / "runs/tiny/version_0/checkpoints"
    saved = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)
    # The run folder was copied from elsewhere: it still updates its own last.ckpt (not a new last-v1.ckpt)
    # and replaces its kept top-1 file.
    assert saved["global_step"] == 6
    assert sorted(p.name for p in ckpts.iterdir()) == ["epoch=2-step=6.ckpt", "last.ckpt"]
    main(["test", *reg_args(tmp_path, CONFIG), "--ckpt_path", "last"])
    assert (tmp_path / "runs/tiny/version_1/results.json").is_file()


def test_a_test_with_a_resumed_runs_own_config_writes_a_folder_of_its_own(tmp_path, trained) -> None:
    """A fit resumed in place writes its folder's name nowhere in its config.yaml, so ``test --config <that file>``
    (what the mismatch refusal above advises) gets a new version folder and leaves the fit's files as they were."""
    import yaml

    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    main(["fit", *reg_args(tmp_path, CONFIG, "--trainer.max_steps", "6"), "--ckpt_path", "last"])
    saved = (run / "config.yaml").read_text()
    assert yaml.safe_load(saved)["trainer"]["logger"]["init_args"]["version"] is None
    main(["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints/last.ckpt")])
    assert (tmp_path / "runs/tiny/version_1/results.json").is_file()
    assert (run / "config.yaml").read_text() == saved
    assert not (run / "results.json").exists()


@pytest.mark.parametrize("sub", ["test", "validate"])
def test_an_evaluation_pinned_to_a_training_runs_folder_is_refused(tmp_path, capsys, trained, sub) -> None:
    """A named version that is a fit's folder (a grid's ``s0``) would have its config.yaml replaced: refused."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    args = [sub, *reg_args(tmp_path, CONFIG, "--trainer.logger.init_args.version", "version_0"),
            "--ckpt_path", str(run / "checkpoints/last.ckpt")]
    line = assert_rejected(tmp_path, capsys, args, "is a training run's folder (it holds checkpoints/)",
                           runs_exist=True)
    assert "--trainer.logger.init_args.version null" in line


def test_an_evaluation_may_write_again_into_the_folder_of_an_earlier_test(tmp_path, trained) -> None:
    """What the refusal above leaves alone (once, not per subcommand): a folder of an earlier test may be written
    again (a grid reruns an unfinished test there)."""
    copy_runs(trained, tmp_path)
    run = tmp_path / "runs/tiny/version_0"
    again = ["test", *reg_args(tmp_path, CONFIG, "--trainer.logger.init_args.version", "t"),
             "--ckpt_path", str(run / "checkpoints/last.ckpt")]
    main(again)
    main(again)
    assert (tmp_path / "runs/tiny/t/results.json").is_file()


def test_a_fresh_fit_over_a_named_runs_last_checkpoint_is_refused(tmp_path, capsys, trained) -> None:
    """A fit's config.yaml keeps a version it was given (a grid's ``s0``); a fresh fit from it would overwrite that
    run's last.ckpt at its first checkpoint: refused, naming both ways on. Resuming there is what the runner does."""
    copy_runs(trained, tmp_path)
    named = reg_args(tmp_path, CONFIG, "--trainer.logger.init_args.version", "version_0", "--trainer.max_steps", "6")
    line = assert_rejected(tmp_path, capsys, ["fit", *named], "already holds a run (checkpoints/last.ckpt)",
                           runs_exist=True)
    assert "resume it with --ckpt_path last" in line
    main(["fit", *named, "--ckpt_path", "last"])
    saved = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 6


def test_resuming_a_run_of_another_experiment_in_place_is_refused(tmp_path, capsys) -> None:
    """``fit --ckpt_path last`` checks the file it would resume from, as an explicit path is checked."""
    run = tmp_path / "runs" / "tiny" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    _fake_ckpt(run / "checkpoints" / "last.ckpt", "lit_icl.mmca.LatentFactorICLModule",
               "lit_icl.mmca.LatentFactorDataModule")
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG), "--ckpt_path", "last"],
                           "another experiment", runs_exist=True)
    assert str(run / "checkpoints" / "last.ckpt") in line


# ------------------------------------------------------------------ runs that train
def test_a_non_finite_loss_stops_the_run_naming_the_step_before_any_checkpoint(tmp_path, capsys) -> None:
    """Adam with lr 1e30 moves every weight by ~1e30 in the first step; the second loss overflows to inf/nan.
    The guard stops the run there, before the end of the first epoch (2 batches) saves a checkpoint."""
    with pytest.raises(SystemExit) as info:
        main(["fit", *reg_args(tmp_path, CONFIG), "--model.init_args.lr", "1e30"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith(ERROR_PREFIX)]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{ERROR_PREFIX} training loss is ") and " at step 1 (epoch 0, batch 1)" in lines[0]
    assert "--model.init_args.lr" in lines[0]
    assert not list((tmp_path / "runs").rglob("*.ckpt")), "no checkpoint may be written after a non-finite loss"


def test_a_deferred_loss_check_names_the_first_non_finite_step_before_the_epoch_checkpoint(tmp_path, capsys,
                                                                                          monkeypatch) -> None:
    """On an accelerator the guard reads the losses on logging steps and before every checkpoint;
    forced onto that path on the CPU, it still names step 1 and stops before the epoch's checkpoint."""
    monkeypatch.setattr(FiniteGuard, "_defers", staticmethod(lambda device: True))
    with pytest.raises(SystemExit):
        main(["fit", *reg_args(tmp_path, CONFIG), "--model.init_args.lr", "1e30"])
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith(ERROR_PREFIX)]
    assert " at step 1 (epoch 0, batch 1)" in line
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


class _LinearModule(LightningModule):
    """The smallest trainable module: one linear layer, loss ``mean(layer(x)^2)``, SGD."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_deferred_loss_check_reads_the_device_on_logging_steps_only(tmp_path, monkeypatch) -> None:
    """Forced onto the accelerator path, the guard reads the kept losses once every ``log_every_n_steps``
    batches (when Lightning's logging reads the device anyway), then at the epoch's end."""
    from lightning.pytorch import Trainer

    monkeypatch.setattr(FiniteGuard, "_defers", staticmethod(lambda device: True))
    reads: list[int] = []
    original = FiniteGuard._check_pending_losses

    def spy(self) -> None:
        if self._pending:
            reads.append(len(self._pending))
        original(self)

    monkeypatch.setattr(FiniteGuard, "_check_pending_losses", spy)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(7, 2)), batch_size=1)
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                      log_every_n_steps=3, callbacks=[FiniteGuard()])
    trainer.fit(_LinearModule(), data)
    assert reads == [3, 3, 1]  # steps 1-3 and 4-6 on their logging steps, step 7 at the epoch's end


def test_non_finite_weights_stop_the_run_before_a_checkpoint_is_saved(tmp_path) -> None:
    """A finite loss with non-finite gradients (so non-finite weights) is caught before the checkpoint."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    class PoisonedGrads(_LinearModule):
        def on_after_backward(self) -> None:
            if self.trainer.global_step == 1:  # the epoch's last batch: the next loss would come after the save
                self.layer.weight.grad.fill_(float("nan"))

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[FiniteGuard(), ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)])
    with pytest.raises(TrainingDiverged, match=r"weights became non-finite by step 2 \(layer.weight\)"):
        trainer.fit(PoisonedGrads(), data)
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").iterdir())


def test_last_without_a_logger_is_looked_for_in_the_default_root_dir(tmp_path, capsys) -> None:
    """With ``--trainer.logger false`` checkpoints go to ``default_root_dir/checkpoints``. ``--ckpt_path last`` was
    left to Lightning there: with nothing to resume it trained from scratch after a warning (status 0), and an
    existing last.ckpt resumed without the checks of its seed and settings."""
    no_logger = ["--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path / "root")]
    line = assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG, *no_logger), "--ckpt_path", "last"],
                           "--ckpt_path last: no earlier run of this config")
    assert f"(looked for {tmp_path / 'root/checkpoints/last.ckpt'})" in line
    main(["fit", *reg_args(tmp_path, CONFIG, *no_logger)])
    assert_rejected(tmp_path, capsys, ["fit", *reg_args(tmp_path, CONFIG, *no_logger, "--seed_everything", "7"),
                                       "--ckpt_path", "last"], "was trained with another seed", runs_exist=True)
    main(["fit", *reg_args(tmp_path, CONFIG, *no_logger, "--trainer.max_steps", "6"), "--ckpt_path", "last"])
    ckpt = torch.load(tmp_path / "root/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 6  # resumed in place
    # Every run without a logger writes into that one folder: a test there replaced the fit's config.yaml and put
    # its results among the fit's files, and a fresh fit started over its last.ckpt.
    fitted = (tmp_path / "root/config.yaml").read_text()
    for sub, extra, needle in [("test", ["--ckpt_path", "last"], "this test would replace its config.yaml"),
                               ("fit", [], "already holds a run (checkpoints/last.ckpt) that a fresh fit would")]:
        line = assert_rejected(tmp_path, capsys, [sub, *reg_args(tmp_path, CONFIG, *no_logger), *extra], needle,
                               runs_exist=True)
        assert line.startswith(f"lit_icl: error: --trainer.logger false: {tmp_path / 'root'} ")
        assert "a folder of its own with --trainer.default_root_dir" in line
    assert (tmp_path / "root/config.yaml").read_text() == fitted
    # in a folder of its own, the same checkpoint tests
    main(["test", *reg_args(tmp_path, CONFIG, "--trainer.logger", "false", "--trainer.default_root_dir",
                            str(tmp_path / "tested")), "--ckpt_path", str(tmp_path / "root/checkpoints/last.ckpt")])
    assert (tmp_path / "tested/results.json").is_file()


def test_last_and_best_resolve_to_the_newest_run_of_the_config(tmp_path) -> None:
    """After a fit, ``test --ckpt_path last|best`` test that run's checkpoints (a fresh process's Lightning
    would find neither); every run has the guard, which adds nothing to the checkpoint."""
    args = reg_args(tmp_path, CONFIG)
    main(["fit", *args])
    ckpts = tmp_path / "runs/tiny/version_0/checkpoints"
    saved = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)
    assert not any("FiniteGuard" in key for key in saved["callbacks"])
    main(["test", *args, "--ckpt_path", "last"])
    meta = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["meta"]
    assert Path(meta["checkpoint"]) == ckpts / "last.ckpt"
    main(["test", *args, "--ckpt_path", "best"])
    meta = json.loads((tmp_path / "runs/tiny/version_2/results.json").read_text())["meta"]
    (best,) = [p for p in ckpts.iterdir() if p.name != "last.ckpt"]
    assert Path(meta["checkpoint"]) == best


def test_best_is_the_monitored_record_whatever_the_order_of_the_callbacks(tmp_path) -> None:
    """A run with the CLI's checkpoint callback (no monitor: its record is the newest epoch file) and a callback
    keeping the best model by a metric: ``--ckpt_path best`` is the metric's best, whichever record comes first."""
    from lit_icl.cli.checkpoints import _best_recorded

    for name in ("epoch=9-step=90.ckpt", "best-epoch=3-step=30.ckpt"):
        (tmp_path / name).touch()
    newest = {"best_model_path": str(tmp_path / "epoch=9-step=90.ckpt"), "best_model_score": None}
    monitored = {"best_model_path": str(tmp_path / "best-epoch=3-step=30.ckpt"), "best_model_score": torch.tensor(0.9)}
    for order in ([("ModelCheckpoint{'monitor': None}", newest), ("ModelCheckpoint{'monitor': 'val/acc'}", monitored)],
                  [("ModelCheckpoint{'monitor': 'val/acc'}", monitored), ("ModelCheckpoint{'monitor': None}", newest)]):
        torch.save({"callbacks": dict(order)}, tmp_path / "last.ckpt")
        assert _best_recorded(tmp_path / "last.ckpt") == tmp_path / "best-epoch=3-step=30.ckpt"
    # Without a monitored record, the newest epoch file is the best there is.
    torch.save({"callbacks": {"ModelCheckpoint{'monitor': None}": newest}}, tmp_path / "last.ckpt")
    assert _best_recorded(tmp_path / "last.ckpt") == tmp_path / "epoch=9-step=90.ckpt"


def test_best_of_a_copied_run_is_the_copys_own_checkpoint(tmp_path) -> None:
    """A run folder copied elsewhere records the original's paths in its ``last.ckpt``: ``--ckpt_path best`` of the
    copy is the copy's own file, not the original run's (which may have trained on since the copy)."""
    from lit_icl.cli.checkpoints import _best_recorded

    original, copy = tmp_path / "original", tmp_path / "copy"
    for folder in (original, copy):
        folder.mkdir()
        (folder / "best-epoch=3-step=30.ckpt").touch()
    record = {"best_model_path": str(original / "best-epoch=3-step=30.ckpt"), "best_model_score": torch.tensor(0.9)}
    torch.save({"callbacks": {"ModelCheckpoint{'monitor': 'val/acc'}": record}}, copy / "last.ckpt")
    assert _best_recorded(copy / "last.ckpt") == copy / "best-epoch=3-step=30.ckpt"
    # A best model kept outside the run's folder (a callback's own dirpath) is found where it was recorded.
    (copy / "best-epoch=3-step=30.ckpt").unlink()
    assert _best_recorded(copy / "last.ckpt") == original / "best-epoch=3-step=30.ckpt"


REG_OVERLAY, REG_BASE = "configs/coqe/regression/cpu.yaml", "configs/coqe/regression.yaml"


@pytest.mark.parametrize(("configs", "order"), [([REG_OVERLAY], "without"), ([REG_OVERLAY, REG_BASE], "before")])
def test_an_overlay_without_or_before_its_base_is_refused_naming_the_order(tmp_path, capsys, configs, order) -> None:
    """An overlay holds only what it changes, so alone (or first) its model options reach LightningModule itself;
    jsonargparse says the option "is not accepted", and the line adds what to give instead."""
    args = ["fit", *[a for c in configs for a in ("--config", c)],
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    line = assert_rejected(tmp_path, capsys, args, "is not accepted (in lightning.LightningModule)")
    assert line.endswith(f": {REG_OVERLAY} is an overlay, given {order} its base; give the base first: "
                         f"--config {REG_BASE} --config {REG_OVERLAY}")


def test_model_options_with_no_config_name_the_base_configs(tmp_path, capsys) -> None:
    line = assert_rejected(tmp_path, capsys, ["fit", "--model.init_args.lr", "0.1",
                                              "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")],
                           "is not accepted (in lightning.LightningModule)")
    assert line.endswith("start with an experiment's base config (configs/<paper>/<experiment>.yaml), then its overlays")


def test_a_run_folder_in_use_by_another_process_is_refused_and_left_alone(tmp_path, capsys) -> None:
    """Two processes in one run folder (the same named version, or a fit resumed twice) would both write it: the
    second is refused in one line. The lock is the folder's own ``flock``, held here as another process would."""
    import fcntl

    args = ["fit", *reg_args(tmp_path, CONFIG), "--trainer.logger.init_args.version", "s0"]
    folder = tmp_path / "runs" / "tiny" / "s0"
    folder.mkdir(parents=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"lit_icl: error: the run folder {folder} is in use by another lit_icl process (the same run "
                       "started twice, or two runs given one --trainer.logger.init_args.version); wait for it to end, "
                       "or give this run another version")
        assert list(folder.iterdir()) == []
    finally:
        os.close(fd)
    main(args)  # released: the run goes ahead, and releases the folder when it ends
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    main([*args[:1], *args[1:], "--ckpt_path", "last", "--trainer.max_steps", "6"])


def test_reduce_lr_on_plateau_on_a_logged_metric_trains(tmp_path) -> None:
    """The monitor check passes a metric the module logs: ReduceLROnPlateau on ``val/mse`` trains and is saved."""
    main(["fit", *reg_args(tmp_path, CONFIG, "--optimizer", "torch.optim.SGD", "--lr_scheduler", "ReduceLROnPlateau",
                           "--lr_scheduler.monitor", "val/mse", "--lr_scheduler.patience", "0")])
    saved = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 4 and saved["lr_schedulers"][0]["patience"] == 0

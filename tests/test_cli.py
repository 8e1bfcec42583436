"""Paper-agnostic CLI behaviour: bad command lines (parser, ``--config``, ``--ckpt_path``) are one
``lit_icl: error:`` line, exit status 2, and write nothing. Non-finite values, trainer flags, output folders,
malformed YAML, ``--ckpt_path last|best`` and checkpoints of another experiment are in
tests/test_bad_input_cli.py; a paper's own CLI tests are in tests/<paper>/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from badinput import assert_rejected
from conftest import tb_scalar_steps, tb_scalars
from icssl.helpers import tiny_args

#: (extra args, needle), added to a tiny IC-SSL run (any config would do: these fail before the paper's code).
CLI_ROWS: list[tuple[list[str], str]] = [
    (["--trainer.max_epochs", "x"], "--trainer.max_epochs: Expected a <class 'int'>. Got value: x"),
    (["--no_such_option", "1"], "unrecognized arguments: --no_such_option"),
    (["--ckpt_path", "does/not/exist.ckpt"], "does not exist"),
    # Lightning raised a ValueError with a traceback (status 1).
    (["--ckpt_path", "hpc"], "--ckpt_path hpc: no HPC checkpoint (hpc_ckpt_N.ckpt"),
    (["--config", "configs/no_such_config.yaml"], "--config: File does not exist"),
    # Lightning ran these, wrote a run folder without a checkpoint and exited 0.
    (["--trainer.max_steps", "0"], "--trainer.max_steps=0 trains nothing"),
    (["--trainer.max_epochs", "0"], "--trainer.max_epochs=0 trains nothing"),
]


@pytest.mark.parametrize(("extra", "needle"), CLI_ROWS, ids=[r[1][:40] for r in CLI_ROWS])
def test_bad_command_line_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, extra, needle) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *tiny_args(tmp_path), *extra], needle)


def test_ckpt_path_that_is_not_a_checkpoint(tmp_path, capsys) -> None:
    bogus = tmp_path / "notes.ckpt"
    bogus.write_text("not a checkpoint")
    line = assert_rejected(
        tmp_path, capsys, ["fit", *tiny_args(tmp_path), "--ckpt_path", str(bogus)], "is not a PyTorch checkpoint"
    )
    assert line.startswith(f"lit_icl: error: --ckpt_path {bogus} is not a PyTorch checkpoint")


@pytest.mark.parametrize("sibling", [True, False], ids=["complete_sibling", "alone"])
def test_ckpt_path_cut_short_is_called_damaged_and_names_the_newest_complete_one(tmp_path, capsys, sibling) -> None:
    """A checkpoint cut at half its length (a full disk under an earlier, non-atomic save) is not 'not a PyTorch
    checkpoint ... written by fit': fit wrote it. The line says it is damaged and names what to resume from."""
    import os

    folder = tmp_path / "old" / "checkpoints"
    folder.mkdir(parents=True)
    cut = folder / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 40}, cut)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    complete = folder / "epoch=0-step=20.ckpt"
    if sibling:
        torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 20}, complete)
        older = folder / "epoch=0-step=10.ckpt"
        torch.save({"state_dict": {}, "global_step": 10}, older)
        os.utime(older, (1, 1))  # older than the one to name
    line = assert_rejected(tmp_path, capsys, ["fit", *tiny_args(tmp_path), "--ckpt_path", str(cut)],
                           f"--ckpt_path {cut} is damaged or truncated")
    assert "not a PyTorch checkpoint" not in line
    if sibling:
        assert line.endswith(f"pass the newest complete checkpoint in its folder, --ckpt_path {complete}")
    else:
        assert line.endswith("its folder holds no other complete checkpoint, so start the run again without "
                             "--ckpt_path")


def test_run_is_named_after_its_config_files() -> None:
    from lit_icl.cli import run_name

    assert run_name(["configs/coqe/omniglot.yaml"]) == "coqe_omniglot"
    assert run_name(["configs/coqe/omniglot.yaml", "configs/coqe/omniglot/cpu.yaml",
                     "configs/coqe/omniglot/transformer.yaml"]) == "coqe_omniglot_cpu_transformer"
    assert run_name(["/elsewhere/my_experiment.yaml", "/tmp/lr.yaml"]) == "my_experiment_lr"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--config", "configs/coqe/regression/cpu.yaml"], "coqe_regression_cpu"),  # derived from the files
        (["--config", "configs/coqe/regression/cpu.yaml", "--trainer.logger.init_args.name", "mine"], "mine"),
    ],
)
def test_the_logger_of_a_built_run_uses_the_derived_name_unless_one_is_given(tmp_path, extra, expected) -> None:
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_icl.cli import LitICLCLI

    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=[
        "--config", "configs/coqe/regression.yaml", *extra, "--trainer.logger.init_args.save_dir", str(tmp_path)])
    assert cli.trainer.logger.name == expected
    assert Path(cli.trainer.logger.log_dir).parent == tmp_path / expected


def test_a_logger_added_to_the_clis_keeps_the_run_named_after_its_config_files(tmp_path) -> None:
    """``--trainer.logger+=CSVLogger`` makes the logger a list: the CLI's TensorBoard logger was left named
    ``lit_icl``, so every experiment that added a logger shared ``runs/lit_icl/`` (and ``--ckpt_path last`` picked
    whichever ran last). The added logger keeps the name it was given."""
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from lit_icl.cli import LitICLCLI

    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=[
        "--config", "configs/coqe/regression.yaml", "--config", "configs/coqe/regression/cpu.yaml",
        "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.logger+=lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(tmp_path), "--trainer.logger.name", "csv"])
    tensorboard, csv = cli.trainer.loggers
    assert isinstance(tensorboard, TensorBoardLogger) and isinstance(csv, CSVLogger)
    assert Path(tensorboard.log_dir).parent == tmp_path / "coqe_regression_cpu"
    assert Path(cli.trainer.log_dir).parent == tmp_path / "coqe_regression_cpu"  # results.json and config.yaml
    assert Path(csv.log_dir).parent == tmp_path / "csv"


@pytest.mark.parametrize("overlays", [[], ["configs/coqe/omniglot/cpu.yaml"]], ids=["alone", "cpu"])
def test_the_main_commands_config_names_its_run_as_the_config_it_includes(tmp_path, overlays) -> None:
    """configs/coqe_omniglot.yaml is `config: coqe/omniglot.yaml` and nothing else: the two names run the same
    config, so they share a run folder (runs/coqe_omniglot/, as the docs say), and --ckpt_path last finds either's.
    The included file was named from its path relative to the including one (runs/omniglot_coqe_omniglot/)."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_icl.cli import LitICLCLI

    names = []
    for base in ("configs/coqe_omniglot.yaml", "configs/coqe/omniglot.yaml"):
        args = [a for o in (base, *overlays) for a in ("--config", o)]
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False,
                        args=[*args, "--trainer.logger.init_args.save_dir", str(tmp_path)])
        names.append(cli.trainer.logger.name)
    assert names == ["_".join(["coqe_omniglot", *(Path(o).stem for o in overlays)])] * 2


def test_fast_dev_run_from_an_empty_folder_writes_no_checkpoint_there(tmp_path, monkeypatch, capsys) -> None:
    """fast_dev_run turns the logger and checkpoints off; Lightning's save-last at the end of training used to
    write ./checkpoints/last.ckpt into the working folder anyway."""
    import logging

    from mmca.synthetic.helpers import mmca_args

    from lit_icl.cli import main

    config = str(Path(__file__).resolve().parents[1] / "configs/mmca/synthetic.yaml")
    monkeypatch.chdir(tmp_path)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    logging.getLogger("lightning.fabric").addHandler(keep)
    try:
        main(["fit", *mmca_args(tmp_path, "--trainer.fast_dev_run", "true", config=config)])
    finally:
        logging.getLogger("lightning.fabric").removeHandler(keep)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "runs").exists()
    # What the CLI held while it built the run (a refusal would print its one line alone) reached the handlers
    # once the run started, in order, and the handlers are Lightning's own again.
    assert [m for m in seen if m.startswith("Seed set to")] == ["Seed set to 0"]
    assert not any(type(h).__name__ == "Collect" for name in ("lightning.pytorch", "lightning.fabric")
                   for h in logging.getLogger(name).handlers)


def test_a_command_line_builds_the_parser_of_its_subcommand_only_and_help_lists_them_all(capsys) -> None:
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_icl.cli import LitICLCLI
    from lit_icl.cli.app import requested_subcommand

    known = LitICLCLI.subcommands()
    assert requested_subcommand(["test", "--config", "x.yaml"], known) == "test"
    for argv in (["--help", "fit"], ["--config", "x.yaml", "fit"], ["fitt"], [], {"fit": {}}):
        assert requested_subcommand(argv, known) is None
    built = []
    original = LitICLCLI._prepare_subcommand_parser

    def record(self, klass, subcommand, **kwargs):
        built.append(subcommand)
        return original(self, klass, subcommand, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LitICLCLI, "_prepare_subcommand_parser", record)
        with pytest.raises(SystemExit):
            LitICLCLI(LightningModule, LightningDataModule, args=["validate", "--config", "configs/mmca/synthetic.yaml",
                                                                  "--print_config"])
        assert built == ["validate"] and "model:" in capsys.readouterr().out
        built.clear()
        with pytest.raises(SystemExit):
            LitICLCLI(LightningModule, LightningDataModule, args=["--help"])
        assert built == list(known)
        assert "{fit,validate,test,predict}" in capsys.readouterr().out


class _Dumped(SystemExit):
    """Stops a run once its config has been dumped (jsonargparse would catch an ``Exception`` there)."""


@pytest.mark.parametrize("config", ["configs/icssl/manifolds.yaml", "configs/mmca/avmnist.yaml"])
def test_the_hyper_parameters_dump_skips_the_second_check_and_writes_what_lightnings_writes(tmp_path, monkeypatch,
                                                                                             config: str) -> None:
    """``LitICLCLI._dump_config`` dumps the parsed config without checking it again (benchmarks/cli_dump.py: about a fifth of a command
    that fails at the model's construction, our CPU): the modules' hyper-parameters stay Lightning's to the value."""
    from lightning.pytorch.cli import LightningCLI

    from lit_icl.cli import main
    from lit_icl.cli.app import LitICLCLI

    ours, dumps = LitICLCLI._dump_config, []

    def both(cli) -> None:
        for dump in (ours, LightningCLI._dump_config):
            cli.__dict__.pop("config_dump", None)
            dump(cli)
            dumps.append(cli.config_dump)
        raise _Dumped

    monkeypatch.setattr(LitICLCLI, "_dump_config", both)
    with pytest.raises(_Dumped):
        main(["fit", "--config", config, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    assert len(dumps) == 2 and dumps[0] == dumps[1] and dumps[0]["model"]["class_path"].startswith("lit_icl.")


def test_a_test_without_a_checkpoint_warns_that_the_weights_are_untrained(tmp_path) -> None:
    """Its rows look like a trained model's (only ``meta.checkpoint: null`` says otherwise); a model with nothing
    to train, such as a closed-form solver tested this way on purpose, is not warned about."""
    from lightning.pytorch import LightningModule
    from torch import nn

    from lit_icl.cli import main
    from lit_icl.cli.app import warn_untrained

    with pytest.warns(UserWarning, match=r"testing SemiSupervisedICL with the weights it was initialised with "
                                         r"\(no --ckpt_path\); pass --ckpt_path"):
        main(["test", *tiny_args(tmp_path)])

    class Solver(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weights", torch.ones(3))

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_untrained(Solver(), None)
        warn_untrained(nn.Linear(2, 2), "some.ckpt")  # with a checkpoint: trained weights


def test_test_and_validate_of_a_checkpoint_log_at_its_step_beside_the_fits_curves(tmp_path, recwarn) -> None:
    """A `test` or `validate` of a checkpoint counts steps from 0, and Lightning wrote its scalars (and the test
    figures) at step 0, away from the fit's validation curve in TensorBoard; they sit where the fit wrote its round
    of the same weights. Lightning's warning that the checkpoint's saving state stays behind in its old folder is
    no news to a run that saves nothing, and is left to fits."""
    from lit_icl.cli import main

    main(["fit", *tiny_args(tmp_path)])  # 2 epochs of 3 steps
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    fit_val = tb_scalar_steps(ckpt.parents[1], "val/")
    # The fit's two rounds, after steps 3 and 6: Lightning writes a round after step N at N - 1.
    assert fit_val and all(steps == [2, 5] for steps in fit_val.values())
    recwarn.clear()
    main(["test", *tiny_args(tmp_path), "--ckpt_path", str(ckpt)])
    main(["validate", *tiny_args(tmp_path), "--ckpt_path", str(ckpt)])
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]
    main(["fit", *tiny_args(tmp_path), "--ckpt_path", str(ckpt), "--trainer.max_epochs", "3"])  # a new folder
    assert [w for w in recwarn if "dirpath has changed" in str(w.message)]
    tested = tb_scalar_steps(tmp_path / "runs/tiny/version_1", "test/")
    validated = tb_scalar_steps(tmp_path / "runs/tiny/version_2", "val/")
    assert tested["images"] and tested.keys() - {"images"}
    assert all(steps == [5] * len(steps) for steps in (*tested.values(), *validated.values())), (tested, validated)
    assert validated.keys() == fit_val.keys()
    # The same weights on the same validation set: the point lands on the fit's last one.
    fit_values, values = tb_scalars(ckpt.parents[1]), tb_scalars(tmp_path / "runs/tiny/version_2")
    assert all(values[tag] == pytest.approx(fit_values[tag][-1:], rel=1e-6) for tag in fit_val)
    # Lightning writes the epoch beside a round's scalars: the checkpoint's (1, the second epoch), not a test's 0.
    assert fit_values["epoch"][-1] == 1 and tb_scalars(tmp_path / "runs/tiny/version_1")["epoch"] == [1]
    assert values["epoch"] == [1] and tb_scalar_steps(tmp_path / "runs/tiny/version_2", "epoch")["epoch"] == [5]


def test_paths_given_with_a_tilde_name_the_home_folder_for_every_part_of_the_run(tmp_path, monkeypatch,
                                                                                  repo_root) -> None:
    """``~`` reaches the program from YAML, ``--ckpt_path=~/...`` and quotes. Lightning's logger wrote its events
    under the home folder while the checkpoints went to a folder named ``~`` in the working folder, every run was
    ``version_0`` (a second test wrote over the first's results), and ``--ckpt_path ~/...`` was "does not exist"."""
    from coqe.regression.helpers import reg_args

    from lit_icl.cli import main

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    args = reg_args(tmp_path, str(Path(repo_root) / "configs/coqe/regression.yaml"), "--trainer.max_steps", "2",
                    "--data.init_args.train_batches_per_epoch", "1", "--data.init_args.shifts", "[id]",
                    "--model.init_args.baselines", "[]", "--trainer.logger.init_args.save_dir", "~/runs")
    main(["fit", *args])
    run = home / "runs/tiny/version_0"
    assert (run / "checkpoints/last.ckpt").is_file()
    main(["test", *args, "--ckpt_path=~/runs/tiny/version_0/checkpoints/last.ckpt"])
    main(["test", *args, "--ckpt_path", "last"])
    tests = sorted(home.glob("runs/tiny/version_*/results.json"))
    assert [p.parent.name for p in tests] == ["version_1", "version_2"]
    assert {json.loads(p.read_text())["meta"]["checkpoint"] for p in tests} == {str(run / "checkpoints/last.ckpt")}
    main(["fit", *args, "--ckpt_path", "last", "--trainer.max_steps", "3"])  # resumed in place
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 3
    assert list(work.iterdir()) == []  # nothing in a folder named ~ (or anywhere) under the working folder


@pytest.mark.parametrize(("sub", "option", "fit_config", "fix"), [
    ("fit", "verbose", True, "give fit the config of the fit that wrote its checkpoint, --config {fit}"),
    ("test", "return_predictions", False, "remove the line 'return_predictions: ...' from it"),
], ids=["fit_of_a_tests_config", "test_of_a_predicts_config_without_its_fit"])
def test_the_saved_config_of_a_test_or_predict_given_to_another_subcommand_names_the_fix(
        tmp_path, capsys, sub, option, fit_config, fix) -> None:
    """A run folder's ``config.yaml`` holds the options of the subcommand that wrote it; given to another one it was
    refused as "Subcommand 'fit' does not accept option 'verbose'", with no word on what to do."""
    fit_run = tmp_path / "runs/tiny/version_0"
    saved = Path("configs/coqe/regression.yaml").read_text()
    if fit_config:
        fit_run.mkdir(parents=True)
        (fit_run / "config.yaml").write_text(saved)
    tested = tmp_path / "saved" / "config.yaml"
    tested.parent.mkdir()
    tested.write_text(f"{saved}\nckpt_path: {fit_run / 'checkpoints/last.ckpt'}\n{option}: true\n")
    line = assert_rejected(tmp_path, capsys, [sub, "--config", str(tested)], f"does not accept option '{option}'",
                           runs_exist=fit_config)
    assert line.endswith(f"{tested} was saved by a {'test or validate' if fit_config else 'predict'} run, whose "
                         f"options {sub} does not take; {fix.format(fit=fit_run / 'config.yaml')}")

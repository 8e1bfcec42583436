"""Ctrl-C during ``fit`` (``StopOnCtrlC``, which the CLI adds to every run): the first one stops the run as SIGTERM
does, after the training step it is in, with ``last.ckpt`` at that step and status 130; resumed, the run ends as an
uninterrupted one. During a validation round it stops after the round; a second Ctrl-C quits at once without
saving. The fits run in this process (the CLI's ``main``); the handlers are the process's own, so each test starts
from Python's default SIGINT handler and leaves it in place."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from icssl.helpers import tiny_args

from lit_icl.callbacks import StopOnCtrlC
from lit_icl.cli import main

EPOCHS, STEPS = 2, 3  # tiny_args: 2 epochs of 3 training steps, a validation round after each


@pytest.fixture(autouse=True)
def default_sigint():
    """Python's own Ctrl-C handler for each test (pytest may run with SIGINT ignored), restored afterwards:
    Lightning's shutdown after a second Ctrl-C sets SIGINT to ignored in the process it runs in."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _fit(root: Path, *extra: str) -> int:
    """A tiny seeded IC-SSL fit under ``root``; its exit status (0 when it returns)."""
    try:
        main(["fit", *tiny_args(root, "--seed_everything", "7", *extra)])
    except SystemExit as stop:
        return stop.code
    return 0


def _signal(record: Path, step: int, times: int = 1, in_validation: bool = False,
            signum: str = "SIGINT") -> tuple[str, str]:
    callback = {"class_path": "subprocess_callbacks.SignalAtStep",
                "init_args": {"path": str(record), "step": step, "signum": signum, "times": times,
                              "in_validation": in_validation}}
    return "--trainer.callbacks", json.dumps([callback])


def _last(root: Path) -> dict:
    return torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] == EPOCHS * STEPS
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        for key in sa:
            assert torch.equal(sa[key], sb[key]), key


@pytest.fixture(scope="module")
def straight_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of the uninterrupted tiny fit, run once: the stopped runs below end as it ended, and the
    evaluations below test and validate its checkpoint (writing under their own roots, never into this one)."""
    default = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        root = tmp_path_factory.mktemp("straight")
        assert _fit(root) == 0
        return root
    finally:
        signal.signal(signal.SIGINT, default)


@pytest.fixture(scope="module")
def straight(straight_root: Path) -> dict:
    return _last(straight_root)


def test_ctrl_c_stops_after_the_step_saves_it_and_the_resumed_run_ends_as_an_uninterrupted_one(
        tmp_path, capsys, straight) -> None:
    """Before, Lightning stopped wherever the interrupt landed, saved nothing and exited 1: the steps since the last
    epoch's checkpoint were lost."""
    record = tmp_path / "ends.txt"
    step = STEPS + 1  # inside the second epoch
    assert _fit(tmp_path, *_signal(record, step)) == 128 + signal.SIGINT
    assert "lit_icl: stopped by Ctrl-C; resume with --ckpt_path last" in capsys.readouterr().err
    assert record.read_text().split() == ["0", "SIGTERMException", str(step)]  # after that step, not inside it
    assert _last(tmp_path)["global_step"] == step
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the process's handler is back
    assert _fit(tmp_path, "--ckpt_path", "last") == 0
    _assert_same_weights(straight, _last(tmp_path))


def test_ctrl_c_in_a_validation_round_stops_after_the_round(tmp_path, capsys, straight) -> None:
    """SIGTERM stops inside a validation round, with no new checkpoint; Ctrl-C lets the round finish, so the epoch's
    checkpoint is written and the resumed run starts the next epoch."""
    record = tmp_path / "ends.txt"
    assert _fit(tmp_path, *_signal(record, STEPS, in_validation=True)) == 128 + signal.SIGINT
    assert "stopped by Ctrl-C" in capsys.readouterr().err
    assert _last(tmp_path)["global_step"] == STEPS
    # The epoch's own save point (its end processed, its count not yet advanced), as every epoch-end checkpoint:
    # the stop came between two epochs, where a new checkpoint would count the epoch complete and could make the
    # resumed run skip one (tests/callbacks/test_checkpoint.py).
    assert _last(tmp_path)["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 1
    assert _last(tmp_path)["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0
    assert _fit(tmp_path, "--ckpt_path", "last") == 0
    _assert_same_weights(straight, _last(tmp_path))


def test_a_second_ctrl_c_quits_at_once_without_saving(tmp_path) -> None:
    record = tmp_path / "ends.txt"
    assert _fit(tmp_path, *_signal(record, STEPS + 1, times=2)) == 1  # Lightning's status after KeyboardInterrupt
    assert record.read_text().split() == ["0", "KeyboardInterrupt", str(STEPS + 1)]
    assert _last(tmp_path)["global_step"] == STEPS  # the first epoch's checkpoint, not the step reached


def test_a_process_that_ignores_ctrl_c_keeps_ignoring_it() -> None:
    """A background job of a script (``cmd &``) or ``nohup`` starts with SIGINT ignored: it must stay so."""

    class Trainer:  # the hooks read nothing of it when they leave the handler alone
        pass

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    callback = StopOnCtrlC()
    callback.setup(Trainer(), None, "fit")
    callback.on_train_start(Trainer(), None)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    callback.teardown(Trainer(), None, "fit")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_ctrl_c_before_the_run_starts_is_one_line_and_status_130(tmp_path, capsys, monkeypatch) -> None:
    """Ctrl-C while the run is being built (the CLI parses, then builds the model, the data and the trainer) has
    nothing to save: one line, status 130, no traceback, nothing written."""
    from lit_icl.cli.app import LitICLCLI

    def interrupted(self, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(LitICLCLI, "instantiate_trainer", interrupted)
    assert _fit(tmp_path) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "lit_icl: interrupted by Ctrl-C before the run started"
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_stop_before_the_first_checkpoint_says_to_start_again_not_to_resume(tmp_path, capsys) -> None:
    """SIGTERM inside the sanity check stops the fit there, before any checkpoint. The last line used to say
    "resume with --ckpt_path last", which then failed: there was nothing to resume."""
    stop = {"class_path": "subprocess_callbacks.SignalInEvaluation", "init_args": {"sanity": True}}
    assert _fit(tmp_path, "--trainer.callbacks", json.dumps([stop]), "--trainer.num_sanity_val_steps", "2",
                "--data.init_args.eval_batch_size", "8") == 128 + signal.SIGTERM  # 2 batches: stopped after one
    assert not (tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lit_icl: stopped by SIGTERM; no checkpoint was written yet, so run the same command again (without "
        "--ckpt_path) to start over")


def test_sigterm_in_a_validation_round_stops_after_it_with_last_ckpt_and_resumes_bit_identical(
    tmp_path, capsys, straight
) -> None:
    """A single-process fit stopped inside the round (Lightning's rule), before the epoch's checkpoint: a SIGTERM
    in the first epoch's round lost the whole epoch ("no checkpoint was written yet"). It now finishes the round
    and saves last.ckpt at the epoch's step, as Ctrl-C and a DDP fit do, and the resumed run ends as one that was
    not stopped."""
    record = tmp_path / "ends.txt"
    stop = _signal(record, STEPS, in_validation=True, signum="SIGTERM")
    assert _fit(tmp_path, *stop, "--data.init_args.eval_batch_size", "8") == 128 + signal.SIGTERM  # 2 batches
    assert record.read_text().split() == ["0", "SIGTERMException", str(STEPS)]
    assert _last(tmp_path)["global_step"] == STEPS
    assert capsys.readouterr().err.strip().splitlines()[-1] == "lit_icl: stopped by SIGTERM; resume with --ckpt_path last"
    assert _fit(tmp_path, "--ckpt_path", "last") == 0
    _assert_same_weights(_last(tmp_path), straight)


def test_a_stop_after_a_checkpoint_says_to_resume_with_a_config_s_own_best_model_callback(tmp_path, capsys) -> None:
    """The IC-SSL configs keep their best model with a checkpoint callback of their own, which Lightning lists
    first and which keeps no last.ckpt: the stop's last line said "no checkpoint was written yet" after the CLI's
    callback had saved one."""
    from icssl.helpers import tiny_args as icssl_args

    record = tmp_path / "ends.txt"
    args = icssl_args(tmp_path, "--seed_everything", "7", config_callbacks=True)
    callback = {"class_path": "subprocess_callbacks.SignalAtStep",
                "init_args": {"path": str(record), "step": STEPS + 1, "signum": "SIGTERM"}}
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, "--trainer.callbacks+", json.dumps(callback)])
    assert stop.value.code == 128 + signal.SIGTERM
    assert _last(tmp_path)["global_step"] == STEPS + 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lit_icl: stopped by SIGTERM; resume with --ckpt_path last")


@pytest.mark.parametrize("sub", ["test", "validate"])
def test_an_evaluation_stopped_by_sigterm_says_to_run_it_again_with_its_checkpoint(tmp_path, capsys, straight_root,
                                                                                     sub) -> None:
    """SIGTERM stops a test or validate of a checkpoint too (Lightning raises it inside the round), with nothing to
    resume. Its last line was the fit's "run the same command again (without --ckpt_path) to start over", which
    for a test scores the untrained model."""
    ckpt = straight_root / "runs/tiny/version_0/checkpoints/last.ckpt"
    stop = {"class_path": "subprocess_callbacks.SignalInEvaluation", "init_args": {"signum": "SIGTERM"}}
    capsys.readouterr()
    with pytest.raises(SystemExit) as end:  # 16 episodes in batches of 8: two batches, stopped after the first
        main([sub, *tiny_args(tmp_path, "--seed_everything", "7", "--data.init_args.eval_batch_size", "8"),
              "--ckpt_path", str(ckpt), "--trainer.callbacks", json.dumps([stop])])
    assert end.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lit_icl: stopped by SIGTERM; a {sub} writes its results only when it ends, so run the same command again "
        "(with the same --ckpt_path)")
    # Ctrl-C there: Lightning's "Detected KeyboardInterrupt" and status 1, as for a crash, and no word on what to do
    stop["init_args"]["signum"] = "SIGINT"
    with pytest.raises(SystemExit) as end:
        main([sub, *tiny_args(tmp_path, "--seed_everything", "7", "--data.init_args.eval_batch_size", "8"),
              "--ckpt_path", str(ckpt), "--trainer.callbacks", json.dumps([stop])])
    assert end.value.code == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Lightning had left Ctrl-C ignored
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lit_icl: interrupted by Ctrl-C; a {sub} writes its results only when it ends, so run the same command "
        "again (with the same --ckpt_path)")

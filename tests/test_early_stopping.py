"""The shared early-stopping rule (``--early_stopping.patience``, :class:`lit_icl.callbacks.StopWhenConverged`).

A tiny IC-SSL run validates every 3 steps. With ``--early_stopping.min_delta 1`` no accuracy can improve on the
first round, so the rule must stop after exactly ``1 + patience`` rounds: the stopping step is known in advance.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from badinput import assert_rejected
from conftest import copy_runs, tb_scalars
from icssl.helpers import tiny_args
from lightning.pytorch import LightningModule

from lit_icl.cli import main
from lit_icl.cli.trainer_setup import _logged_metrics

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
STEPS_PER_ROUND = 3  # tiny_args: 3 training batches per epoch, one validation round per epoch
METRIC = "val/acc/label_ratio=0.25"
#: A monitored best-checkpoint callback, as the shipped IC-SSL configs have (tiny_args drops the config's).
BEST = json.dumps([{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"monitor": METRIC, "mode": "max", "save_top_k": 1,
                                  "filename": "best-{epoch}-{step}"}}])


def run_dir(root: Path, name: str = "es") -> Path:
    return root / "runs" / name / "version_0"


def fit_args(root: Path, *extra: str, epochs: int = 20) -> list[str]:
    return ["fit", *tiny_args(root, "--trainer.max_epochs", str(epochs), "--trainer.callbacks", BEST, *extra,
                              name="es")]


#: The rule of the shared fits: with min_delta 1 only the first round improves, so patience p stops at round 1 + p.
RULE_1 = ("--early_stopping.patience", "1", "--early_stopping.min_delta", "1.0")
RULE_2 = ("--early_stopping.patience", "2", "--early_stopping.min_delta", "1.0")


def _shared_fit(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str, epochs: int = 20) -> Path:
    """The root of one fit with ``args``, made once for the module; tests only read it, or copy it (``copy_runs``)."""
    root = tmp_path_factory.mktemp(name)
    main(fit_args(root, *args, epochs=epochs))
    return root


@pytest.fixture(scope="module")
def stopped_by_patience_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-epoch fit that ``RULE_2`` stops at step 9 (rounds 2 and 3 do not improve on round 1)."""
    return _shared_fit(tmp_path_factory, "patience_2", *RULE_2)


@pytest.fixture(scope="module")
def stopped_by_patience_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-epoch fit that ``RULE_1`` stops at step 6 (round 2 does not improve on round 1)."""
    return _shared_fit(tmp_path_factory, "patience_1", *RULE_1)


@pytest.fixture(scope="module")
def one_round_under_patience_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-epoch fit under ``RULE_2``: a checkpoint with the rule's state, for resumes with other rules."""
    return _shared_fit(tmp_path_factory, "one_round", *RULE_2, epochs=1)


def test_stops_after_patience_rounds_without_improvement_and_records_where(stopped_by_patience_2: Path) -> None:
    root = stopped_by_patience_2
    record = json.loads((run_dir(root) / "stopping.json").read_text())
    assert record["monitor"] == METRIC and record["mode"] == "max"  # taken from the config's checkpoint
    assert record["best_step"] == STEPS_PER_ROUND  # the first round is the only improvement
    assert record["stopped_step"] == 3 * STEPS_PER_ROUND  # 1 + patience rounds, far below the 20-epoch cap
    assert record["stopped_early"] is True
    last = torch.load(run_dir(root) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == record["stopped_step"]
    # The config's own best checkpoint (no min_delta) is the round with the highest score, independent of the rule.
    scores = tb_scalars(run_dir(root))[METRIC]
    assert len(scores) == 3
    top = scores.index(max(scores))
    best = list((run_dir(root) / "checkpoints").glob("best-*.ckpt"))
    assert [p.name for p in best] == [f"best-epoch={top}-step={(top + 1) * STEPS_PER_ROUND}.ckpt"]
    assert record["best_score"] == pytest.approx(scores[0])  # the first round, the rule's only improvement
    assert record["best_score"] == pytest.approx(float(last["callbacks"][next(
        k for k in last["callbacks"] if k.startswith("StopWhenConverged"))]["best_score"]))


def test_resuming_a_run_the_rule_has_ended_trains_nothing(tmp_path: Path, stopped_by_patience_1: Path) -> None:
    """``fit --ckpt_path last`` of a finished run does nothing, as for a run at its ``max_steps``. The stopping
    round's checkpoint does not hold Lightning's stop flag: the resumed run trained one round more (step 6 to 9)
    and replaced the run's ``last.ckpt`` and ``stopping.json``."""
    copy_runs(stopped_by_patience_1, tmp_path)
    last = run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    record, before = (run_dir(tmp_path) / "stopping.json").read_text(), torch.load(last, weights_only=True)
    assert json.loads(record)["stopped_step"] == before["global_step"] == 2 * STEPS_PER_ROUND
    main(fit_args(tmp_path, *RULE_1, "--ckpt_path", "last"))
    after = torch.load(last, weights_only=True)
    assert after["global_step"] == before["global_step"]
    assert all(torch.equal(after["state_dict"][k], v) for k, v in before["state_dict"].items())
    assert (run_dir(tmp_path) / "stopping.json").read_text() == record


def test_a_run_the_rule_ended_goes_on_under_a_higher_patience_as_an_uninterrupted_run_with_it(
        tmp_path: Path, stopped_by_patience_2: Path, stopped_by_patience_1: Path) -> None:
    """Resumed with a higher ``--early_stopping.patience``, a run that a lower one ended trains on and stops where a
    run with the higher patience from the start stops, with the same weights and record: the rounds counted so far
    are the same under both, so only the stop itself differs."""
    straight, resumed = stopped_by_patience_2, tmp_path / "resumed"
    copy_runs(stopped_by_patience_1, resumed)
    assert json.loads((run_dir(resumed) / "stopping.json").read_text())["stopped_step"] == 2 * STEPS_PER_ROUND
    main(fit_args(resumed, "--early_stopping.patience", "2", "--early_stopping.min_delta", "1.0", "--ckpt_path", "last"))
    a, b = (json.loads((run_dir(r) / "stopping.json").read_text()) for r in (straight, resumed))
    assert a == b and a["stopped_step"] == 3 * STEPS_PER_ROUND and a["patience"] == 2
    wa, wb = (torch.load(run_dir(r) / "checkpoints" / "last.ckpt", weights_only=True) for r in (straight, resumed))
    assert all(torch.equal(wa["state_dict"][k], v) for k, v in wb["state_dict"].items())


RESUMED_RULE_ROWS = [
    (["--early_stopping.patience", "1", "--early_stopping.min_delta", "1.0"],
     "--early_stopping.patience 1 is below the checkpoint's 2"),
    (["--early_stopping.patience", "2", "--early_stopping.min_delta", "0.5"],
     "--early_stopping.min_delta is 0.5 here but 1.0 in the checkpoint"),
    (["--early_stopping.patience", "2", "--early_stopping.min_delta", "1.0", "--early_stopping.wait_for_score", "0.2"],
     "--early_stopping.wait_for_score is 0.2 here but None in the checkpoint"),
    (["--early_stopping.patience", "2", "--early_stopping.min_delta", "1.0", "--early_stopping.monitor", "val/loss",
      "--early_stopping.mode", "min"], "the rule monitors 'val/loss' (min) here but"),
]


@pytest.mark.parametrize(("extra", "needle"), RESUMED_RULE_ROWS, ids=["patience", "min_delta", "wait", "monitor"])
def test_a_resume_whose_rule_counted_its_rounds_otherwise_is_refused(tmp_path, capsys, one_round_under_patience_2,
                                                                    extra, needle) -> None:
    """A resumed run goes on counting the checkpoint's rounds without improvement, so those must have been counted
    as its own rule counts them; Lightning restored the checkpoint's patience over the command line's (and
    config.yaml then recorded the other), and dropped the state of a rule with another monitor or mode."""
    copy_runs(one_round_under_patience_2, tmp_path)
    line = assert_rejected(tmp_path, capsys, fit_args(tmp_path, *extra, "--ckpt_path", "last", epochs=20), needle,
                           runs_exist=True)
    assert "resume with the checkpoint's settings" in line


def test_the_rule_refuses_from_python_what_the_cli_refuses() -> None:
    """``Trainer.fit(ckpt_path=...)`` from Python reaches the rule's ``load_state_dict`` without the CLI's check."""
    from lit_icl.callbacks.stopping import StopWhenConverged
    from lit_icl.core.errors import ConfigError

    saved = StopWhenConverged(monitor="m", patience=3, min_delta=0.1).state_dict()
    with pytest.raises(ConfigError, match="patience 2 is below the checkpoint's 3"):
        StopWhenConverged(monitor="m", patience=2, min_delta=0.1).load_state_dict(saved)
    raised = StopWhenConverged(monitor="m", patience=5, min_delta=0.1)
    raised.load_state_dict(saved)
    assert raised.patience == 5


def test_the_step_cap_ends_a_run_that_keeps_improving(tmp_path: Path) -> None:
    main(fit_args(tmp_path, "--early_stopping.patience", "50", epochs=3))
    record = json.loads((run_dir(tmp_path) / "stopping.json").read_text())
    assert record["stopped_early"] is False
    assert record["stopped_step"] == 3 * STEPS_PER_ROUND
    assert record["best_step"] in (3, 6, 9)


def test_a_test_run_reports_how_its_checkpoint_was_trained(tmp_path: Path, stopped_by_patience_1: Path) -> None:
    # The test run writes under tmp_path only; the shared fit is read.
    record = json.loads((run_dir(stopped_by_patience_1) / "stopping.json").read_text())
    best = next((run_dir(stopped_by_patience_1) / "checkpoints").glob("best-*.ckpt"))
    main(["test", *tiny_args(tmp_path, name="es_test"), "--ckpt_path", str(best)])
    meta = json.loads((run_dir(tmp_path, "es_test") / "results.json").read_text())["meta"]
    assert meta["stopping"] == record
    assert meta["trained_steps"] == record["best_step"] == STEPS_PER_ROUND
    assert record["stopped_step"] == 2 * STEPS_PER_ROUND


@pytest.mark.parametrize(("min_epochs", "stopped", "best"), [
    (None, 3, 1),  # no minimum: rounds 2 and 3 do not improve on round 1, so round 3 stops the run
    (5, 6, 4),  # the rule fires at round 3, but the minimum holds the run, round 4 improves, round 6 stops it
    (8, 8, 4),  # no improvement for 2 rounds by round 6, but the minimum is 8 epochs: stop at the first round after
])
def test_a_minimum_length_defers_the_decision_and_an_improvement_before_it_counts(tmp_path, min_epochs, stopped,
                                                                                    best) -> None:
    # Lightning's EarlyStopping alone keeps its stop flag up once raised, so with min_epochs 5 it would end the run
    # at epoch 5 although round 4 improved; the shared rule decides again at every round.
    scripted = [{"class_path": "subprocess_callbacks.ScriptedMetric",
                 "init_args": {"values": [0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]}}]
    extra = [] if min_epochs is None else ["--trainer.min_epochs", str(min_epochs)]
    main(["fit", *tiny_args(tmp_path, "--trainer.max_epochs", "10", "--trainer.callbacks", json.dumps(scripted),
                            "--early_stopping.patience", "2", "--early_stopping.monitor", "scripted",
                            "--early_stopping.mode", "max", *extra, name="es")])
    record = json.loads((run_dir(tmp_path) / "stopping.json").read_text())
    assert record["best_step"] == best * STEPS_PER_ROUND and record["best_score"] == pytest.approx(
        0.9 if best == 4 else 0.5)
    assert record["stopped_step"] == stopped * STEPS_PER_ROUND
    assert record["stopped_early"] is True and "did not improve" in record["reason"]


@pytest.mark.parametrize(("wait_for", "values", "stopped", "best", "early"), [
    # A chance plateau with a noise peak (0.12) at round 2: patience 2 alone stops the run at round 4.
    (None, [0.1, 0.12, 0.1, 0.1, 0.1, 0.5, 0.6, 0.6], 4, 2, True),
    # Waiting for 0.2: rounds 4-5 cannot stop it; it leaves chance at round 6, improves at 7, stops at 9.
    (0.2, [0.1, 0.12, 0.1, 0.1, 0.1, 0.5, 0.6, 0.6], 9, 7, True),
    # A run that never passes the value trains to the cap (10 epochs) and says the rule did not end it.
    (0.2, [0.1, 0.12, 0.1], 10, 2, False),
])
def test_waiting_for_a_score_keeps_a_run_on_its_chance_plateau_until_it_leaves(tmp_path, wait_for, values, stopped,
                                                                                  best, early) -> None:
    scripted = [{"class_path": "subprocess_callbacks.ScriptedMetric", "init_args": {"values": values}}]
    extra = [] if wait_for is None else ["--early_stopping.wait_for_score", str(wait_for)]
    main(["fit", *tiny_args(tmp_path, "--trainer.max_epochs", "10", "--trainer.callbacks", json.dumps(scripted),
                            "--early_stopping.patience", "2", "--early_stopping.monitor", "scripted",
                            "--early_stopping.mode", "max", *extra, name="es")])
    record = json.loads((run_dir(tmp_path) / "stopping.json").read_text())
    assert record["wait_for_score"] == wait_for
    assert record["best_step"] == best * STEPS_PER_ROUND
    assert record["stopped_step"] == stopped * STEPS_PER_ROUND
    assert record["stopped_early"] is early


def test_a_fit_with_the_rule_is_tested_from_its_own_saved_config(tmp_path: Path, stopped_by_patience_1: Path) -> None:
    # The table drivers test a model with `--config <fit folder>/config.yaml`, which holds the fit's
    # early_stopping options; the test must neither stop early nor refuse them for lack of a monitor.
    # The fit is shared: its saved config logs into the shared folder, so the test is sent to tmp_path
    # (--trainer.logger.init_args.save_dir; the early_stopping options all come from the saved config).
    saved = run_dir(stopped_by_patience_1) / "config.yaml"
    assert "patience: 1" in saved.read_text()
    best = next((run_dir(stopped_by_patience_1) / "checkpoints").glob("best-*.ckpt"))
    main(["test", "--config", str(saved), "--trainer.callbacks", "[]", "--ckpt_path", str(best),
          "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.logger.init_args.version", "test"])
    results = json.loads((run_dir(tmp_path).parent / "test" / "results.json").read_text())
    assert results["meta"]["stopping"]["best_step"] == STEPS_PER_ROUND
    assert any(r["metric"] == "accuracy" for r in results["rows"])


def test_runs_without_the_rule_record_nothing(tmp_path: Path) -> None:
    main(fit_args(tmp_path, epochs=1))
    assert not (run_dir(tmp_path) / "stopping.json").exists()


BAD_ROWS = [
    (["--early_stopping.patience", "0"], "--early_stopping.patience=0 must be >= 1"),
    (["--early_stopping.patience", "2", "--early_stopping.min_delta", "-0.1"], "--early_stopping.min_delta"),
    (["--early_stopping.patience", "2", "--trainer.callbacks", "[]"],
     ("checkpoints monitor none; pass --early_stopping.monitor <metric> --early_stopping.mode max|min; ICSSLModule "
     "logs val/acc/label_ratio=")),
    (["--early_stopping.patience", "2", "--early_stopping.monitor", "val/loss"],
     "pass --early_stopping.mode max (accuracies) or min (losses)"),
    (["--early_stopping.patience", "2", "--early_stopping.monitor", "val/no_such_metric",
      "--early_stopping.mode", "max"], "StopWhenConverged monitors 'val/no_such_metric'"),
    (["--early_stopping.patience", "2", "--early_stopping.wait_for_score", "inf"],
     "--early_stopping.wait_for_score: inf is not a finite number"),
]


@pytest.mark.parametrize(("extra", "needle"), BAD_ROWS, ids=[r[1][:40] for r in BAD_ROWS])
def test_bad_early_stopping_options_are_refused_before_anything_is_written(tmp_path, capsys, extra, needle) -> None:
    assert_rejected(tmp_path, capsys, fit_args(tmp_path, *extra), needle)


def test_the_no_metric_refusal_names_what_each_kind_of_model_logs() -> None:
    """CoQE regression logs an error, not an accuracy; I2CL has no validation rounds at all."""

    class Regression(LightningModule):
        def validation_keys(self) -> set[str]:
            return {"val/mse"}

    class NoValidation(LightningModule):
        def validation_keys(self) -> set[str]:
            return set()

    assert _logged_metrics(Regression()) == "; Regression logs val/mse (max for accuracies, min for errors and losses)"
    assert _logged_metrics(NoValidation()).endswith("nothing to stop on: drop --early_stopping.patience")
    assert _logged_metrics(None) == " (max for accuracies, min for errors and losses)"


def _fit_subprocess(root: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")])
    args = fit_args(root, "--early_stopping.patience", "2", "--early_stopping.min_delta", "1.0", *extra)
    return subprocess.run([sys.executable, "-m", "lit_icl", *args], check=False, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # 45 s; exact resume after SIGKILL stays in the default suite in tests/test_reproducibility.py
def test_sigkill_while_waiting_then_resume_stops_where_the_uninterrupted_run_stops(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = _fit_subprocess(straight)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Rounds end at steps 3 (best), 6 (one round without improvement) and 9 (two: stop). Killed at step 8, the
    # run keeps the checkpoint of step 6, which must already count the round at step 6.
    kill = [{"class_path": "subprocess_callbacks.KillAtStep", "init_args": {"step": 8}},
            json.loads(BEST)[0]]
    proc = _fit_subprocess(killed, "--trainer.callbacks", json.dumps(kill))
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    assert not (run_dir(killed) / "stopping.json").exists()
    proc = _fit_subprocess(killed, "--ckpt_path", "last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (json.loads((run_dir(r) / "stopping.json").read_text()) for r in (straight, killed))
    assert a == b and a["stopped_step"] == 3 * STEPS_PER_ROUND
    wa, wb = (torch.load(run_dir(r) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
              for r in (straight, killed))
    assert wa["global_step"] == wb["global_step"] == a["stopped_step"]
    for key in wa["state_dict"]:
        assert torch.equal(wa["state_dict"][key], wb["state_dict"][key]), f"weights differ in {key}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_suite.py runs it)")
def test_the_rule_runs_on_a_gpu(tmp_path: Path) -> None:
    # On a GPU the monitored metric, and so Lightning's best score after an improving round, live on the device
    # while the score before the first round is a CPU tensor; comparing the two must not fail.
    main(fit_args(tmp_path, "--trainer.accelerator", "gpu", "--compile.mode", "off", "--early_stopping.patience", "2",
                  "--early_stopping.min_delta", "1.0"))
    record = json.loads((run_dir(tmp_path) / "stopping.json").read_text())
    assert record["best_step"] == STEPS_PER_ROUND and record["stopped_step"] == 3 * STEPS_PER_ROUND

"""Every module declares the ``val/...`` metrics it logs (``ICLModule.validation_keys``), and the CLI refuses a
ModelCheckpoint or EarlyStopping that monitors anything else before the run starts (Lightning would stop the
run with a traceback at the end of the first validation, after an epoch of training)."""

from __future__ import annotations

from pathlib import Path

import pytest
from badinput import assert_rejected
from coqe.omniglot.helpers import coqe_args
from coqe.regression.helpers import overlay, reg_args
from icssl.helpers import tiny_args
from lightning.pytorch import LightningDataModule, LightningModule
from mmca.avmnist.helpers import avmnist_args, write_layout
from mmca.synthetic.helpers import mmca_args

from lit_icl.cli import LitICLCLI

TRANSFORMER = ("configs/coqe/omniglot.yaml", "configs/coqe/omniglot/transformer.yaml")


def _args(kind: str, tmp_path: Path) -> list[str]:
    if kind == "regression":
        return reg_args(tmp_path, overlay("cpu"))
    if kind == "icssl":
        return tiny_args(tmp_path, "--trainer.max_epochs", "1")
    if kind == "coqe_omniglot":
        return coqe_args(tmp_path)
    if kind == "coqe_transformer":
        return coqe_args(tmp_path, config=TRANSFORMER)
    if kind == "mmca_synthetic":
        return mmca_args(tmp_path, "--trainer.max_epochs", "1")
    write_layout(tmp_path / "av")
    return avmnist_args(tmp_path, tmp_path / "av", "--trainer.max_epochs", "1")


KINDS = ["regression", "icssl", "coqe_omniglot", "coqe_transformer", "mmca_synthetic", "avmnist"]


@pytest.mark.parametrize("kind", KINDS)
def test_declared_validation_keys_are_what_validation_logs(tmp_path, kind) -> None:
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=_args(kind, tmp_path))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    logged = {key for key in cli.trainer.callback_metrics if key.startswith("val/")}
    assert logged == cli.model.validation_keys()


@pytest.mark.parametrize(("kind", "callback"), [("regression", "EarlyStopping"), ("coqe_transformer", "ModelCheckpoint")])
def test_a_monitor_the_model_does_not_log_is_refused_before_the_run(tmp_path, capsys, kind, callback) -> None:
    """The Transformer logs no static-head accuracy: monitoring it is refused, naming what is logged."""
    monitor = "val/acc/iwl_static" if kind == "coqe_transformer" else "val/loss"
    args = ["fit", *_args(kind, tmp_path), f"--trainer.callbacks+=lightning.pytorch.callbacks.{callback}",
            "--trainer.callbacks.monitor", monitor]
    line = assert_rejected(tmp_path, capsys, args, f"{callback} monitors '{monitor}', which")
    assert "it logs val/" in line


def test_a_test_with_other_evaluation_settings_ignores_the_fits_monitor(tmp_path) -> None:
    """IC-SSL's config keeps its best model by ``val/acc/label_ratio=0.25``; a test at other label ratios never
    validates, so that monitor is not checked and the test runs at the ratios it was given."""
    import json

    from lit_icl.cli import main

    args = tiny_args(tmp_path, "--trainer.max_epochs", "1", config_callbacks=True)
    main(["fit", *args])
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    main(["test", *args, "--ckpt_path", str(ckpt), "--data.init_args.eval_label_ratios", "[0.1, 0.5]"])
    rows = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["rows"]
    assert {r["label_ratio"] for r in rows if r["metric"] == "accuracy"} == {0.1, 0.5}

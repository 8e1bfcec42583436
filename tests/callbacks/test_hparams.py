"""TensorBoard's HPARAMS tab gets each CLI run's settings and the metrics it logs (:class:`HParamsView`)."""

from __future__ import annotations

from pathlib import Path

from icssl.helpers import tiny_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from lit_icl.callbacks.hparams import flat_hparams
from lit_icl.cli import main


def _hparams_tab(run: Path) -> tuple[dict[str, object], list[str], list[str]]:
    """``(hyper-parameters of the run, the tab's metric names, the run's scalar tags)`` read from its events."""
    params: dict[str, object] = {}
    metrics: list[str] = []
    scalars: list[str] = []
    for path in sorted(run.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(path))
        events.Reload()
        scalars += events.Tags()["scalars"]
        for content in events.PluginTagToContent("hparams").values():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("experiment"):
                metrics += [info.name.tag for info in data.experiment.metric_infos]
            if data.HasField("session_start_info"):
                for key, value in data.session_start_info.hparams.items():
                    params[key] = getattr(value, value.WhichOneof("kind"))
    return params, metrics, scalars


def test_flat_hparams_names_nested_settings_by_path_and_shows_the_rest_as_text() -> None:
    nested = {"lr": 0.01, "net": {"class_path": "a.B", "init_args": {"width": 16, "sizes": [1, 2], "act": None}},
              "augment": False, "_instantiator": "x"}
    assert flat_hparams(nested) == {"lr": 0.01, "net/class_path": "a.B", "net/init_args/width": 16,
                                    "net/init_args/sizes": "[1, 2]", "net/init_args/act": "None", "augment": False}


def test_fit_and_test_fill_the_hparams_tab_with_the_run_settings_and_logged_metrics(tmp_path) -> None:
    main(["fit", *tiny_args(tmp_path)])
    fit = tmp_path / "runs/tiny/version_0"
    params, metrics, scalars = _hparams_tab(fit)
    assert params["lr"] == 0.003 and params["batch_size"] == 16 and params["seed_everything"] == 0
    assert params["net/class_path"] == "lit_icl.icssl.SemiSupervisedICL"
    # The module's validation metrics and the training loss, each one the run logs; no hp_metric of its own.
    assert sorted(metrics) == sorted({"train/loss", "val/loss", "val/acc/label_ratio=0.1",
                                      "val/acc/label_ratio=0.25", "val/acc/label_ratio=0.5"})
    assert set(metrics) <= set(scalars) and "hp_metric" not in scalars
    main(["test", *tiny_args(tmp_path), "--ckpt_path", str(fit / "checkpoints/last.ckpt")])
    params, metrics, scalars = _hparams_tab(tmp_path / "runs/tiny/version_1")
    assert params["lr"] == 0.003
    assert metrics and all(tag.startswith("test/") for tag in metrics) and set(metrics) <= set(scalars)


def test_a_module_that_declares_no_validation_metrics_gets_what_it_logged_when_the_fit_ends(tmp_path) -> None:
    """I2CL declares no validation metrics and logs ``train/loss/<method>``: its entry is written at the fit's end."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_icl.callbacks import HParamsView

    class Logs(BoringModel):
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters()

        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("train/loss/zero_shot", out["loss"])
            return out

    logger = TensorBoardLogger(tmp_path, name="run", default_hp_metric=False)
    Trainer(max_steps=3, logger=logger, callbacks=[HParamsView()], limit_val_batches=0, log_every_n_steps=1,
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False).fit(Logs(width=5))
    params, metrics, scalars = _hparams_tab(Path(logger.log_dir))
    assert params["width"] == 5 and metrics == ["train/loss/zero_shot"] and "train/loss/zero_shot" in scalars

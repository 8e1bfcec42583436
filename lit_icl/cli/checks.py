"""Input checks the CLI runs before a run writes anything: the ``--config`` files' YAML, trainer counts,
monitored metrics and output folders. Each refuses with a :class:`ConfigError` that names the fix."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden

from lit_icl.cli.checkpoints import import_class, pinned_run_folder
from lit_icl.cli.messages import config_paths
from lit_icl.core.configfiles import check_config_file
from lit_icl.core.errors import ConfigError, StorageError
from lit_icl.core.module import ICLModule


def check_config_files(args: list[Any]) -> None:
    """Refuse a ``--config`` file that is not valid YAML (naming the file, line and problem) or that is empty
    (:func:`lit_icl.core.configfiles.check_config_file`). A file that does not exist is left to the parser, whose
    message already says so."""
    for raw in config_paths(args):
        if Path(raw).is_file():
            check_config_file(raw)


#: Trainer flags that Lightning divides by (a 0 ends in ZeroDivisionError after the run folder exists) or that
#: accept out-of-range values silently: flag -> (smallest value, what it means).
TRAINER_COUNTS: dict[str, tuple[int, str]] = {
    "accumulate_grad_batches": (1, "batches per optimizer step"),
    "check_val_every_n_epoch": (1, "epochs between validations; null validates by steps only"),
    "log_every_n_steps": (0, "steps between logged training metrics; 0 logs none"),
    "num_sanity_val_steps": (-1, "validation batches before training; -1 runs them all, 0 none"),
}


def check_monitors(trainer: Trainer, model: ICLModule, lr_scheduler: Any = None) -> None:
    """Refuse a callback, or the ``--lr_scheduler`` (``ReduceLROnPlateau``), that monitors a ``val/...`` metric the
    model does not log.

    ModelCheckpoint, EarlyStopping and ReduceLROnPlateau look their ``monitor`` up only at the end of the first
    validation, after the run folder exists and an epoch has been trained, and then stop the run with a traceback.
    The CLI checks this for ``fit`` only: a ``test`` of the same config (with other evaluation settings) never
    validates. ``lr_scheduler`` is the parsed ``--lr_scheduler`` option (``None`` when not given).
    """
    keys = model.validation_keys()
    if keys is None:
        return
    watchers = [(f"{type(callback).__name__}", "the callback's monitor", getattr(callback, "monitor", None))
                for callback in getattr(trainer, "callbacks", None) or []]
    init_args = getattr(lr_scheduler, "init_args", None)
    if init_args is not None:
        watchers.append((f"--lr_scheduler {lr_scheduler.class_path}", "--lr_scheduler.monitor",
                         init_args.get("monitor")))
    for who, option, monitor in watchers:
        if isinstance(monitor, str) and monitor.startswith("val/") and monitor not in keys:
            logged = ", ".join(sorted(keys)) if keys else "none (this model has no validation loop)"
            raise ConfigError(
                f"{who} monitors {monitor!r}, which {type(model).__name__} does not log; "
                f"it logs {logged}: set {option} to one of those, or change the settings so that "
                f"{monitor!r} is logged"
            )


def check_scheduler_has_optimizer(config: Any) -> None:
    """Refuse a ``fit`` given ``--lr_scheduler`` without ``--optimizer``. LightningCLI builds the scheduler only
    together with the optimizer (the two replace the module's ``configure_optimizers``); alone it is ignored, and
    the run trains with the module's own optimizer and schedule while its ``config.yaml`` records the scheduler."""
    scheduler = config.get("lr_scheduler")
    if scheduler is None or config.get("optimizer") is not None:
        return
    name = getattr(scheduler, "class_path", scheduler)
    raise ConfigError(
        f"--lr_scheduler {name} is used only with --optimizer (the two replace the module's own optimizer and "
        "schedule), so alone it would be ignored: add an optimizer, e.g. --optimizer torch.optim.Adam "
        "--optimizer.lr 0.001, or drop --lr_scheduler"
    )

def check_val_interval(trainer: Trainer, datamodule: Any) -> None:
    """Refuse an integer ``val_check_interval`` longer than a training epoch while validation also waits for
    epochs (``check_val_every_n_epoch`` set): Lightning refuses it only once the run folder and its config exist.
    Checked for data modules that say their epoch's length (``train_batches_per_epoch``)."""
    interval = trainer.val_check_interval
    hparams = getattr(datamodule, "hparams", None) or {}
    per_epoch = hparams.get("train_batches_per_epoch") if hasattr(hparams, "get") else None
    if (isinstance(interval, bool) or not isinstance(interval, int) or trainer.check_val_every_n_epoch is None
            or not isinstance(per_epoch, int) or not trainer.limit_val_batches):
        return  # as Lightning: no rule without epochs to wait for, or without validation
    limit = trainer.limit_train_batches
    batches = min(per_epoch, limit) if isinstance(limit, int) and not isinstance(limit, bool) else per_epoch
    if isinstance(limit, float) and limit < 1.0:
        batches = int(per_epoch * limit)
    if 0 < batches < interval:  # no training batches: Lightning trains nothing and checks nothing
        raise ConfigError(
            f"--trainer.val_check_interval={interval} is longer than an epoch ({batches} training batches); give at "
            f"most {batches}, or add --trainer.check_val_every_n_epoch null to validate every {interval} steps "
            "across epochs"
        )


def check_eval_shards(trainer: Trainer, datamodule: Any, subcommand: str | None) -> None:
    """The evaluation sets the subcommand runs (test's for ``test``, validation's for ``fit`` and ``validate``)
    shard over the DDP ranks as the data module's loaders need, for a data module that can tell (its
    ``check_eval_shards``: the generated sets split evenly, avMNIST's and I2CL's give every rank a batch);
    ``predict``'s sampler pads nothing. The ranks are those that run: under torchrun or srun the launcher's world
    size, which Lightning compares with ``num_nodes x devices`` itself at start-up, naming both."""
    check = getattr(datamodule, "check_eval_shards", None)
    if callable(check) and subcommand != "predict":
        check(trainer.world_size, ("test",) if subcommand == "test" else ("val",))


def check_precision_request(trainer: Trainer, trainer_config: Any) -> None:
    """Refuse ``--trainer.precision 16-mixed`` where Lightning runs bf16-mixed instead (on the CPU, with a warning):
    the run's ``config.yaml`` and ``results.json`` would record fp16 for a bf16 run."""
    asked = str(trainer_config.get("precision") if trainer_config is not None else None)
    if asked in ("16", "16-mixed") and str(trainer.precision) == "bf16-mixed":
        raise ConfigError(f"--trainer.precision {asked}: fp16 mixed precision needs a GPU, and on this "
                          f"{trainer.accelerator.__class__.__name__.removesuffix('Accelerator')} Lightning would run "
                          "bf16-mixed while the run's records said 16-mixed; give --trainer.precision bf16-mixed")


#: What each evaluation subcommand needs (the module's step, the data's loader) and what to use instead.
EVALUATION_LOOPS = {
    "predict": ("predict_step", "predict_dataloader", "to predict",
                ("use test, which writes results.json and figures into the run folder (predict serves IC-SSL's "
                 "per-point probabilities)")),
    "validate": ("validation_step", "val_dataloader", "to validate",
                 "use test, which scores the model and writes results.json into the run folder"),
}


def check_evaluation_loop(subcommand: str | None, model: Any, datamodule: Any) -> None:
    """Refuse ``predict`` or ``validate`` for a module without that step of its own or data without that loader:
    Lightning would run the module's ``forward`` on the batches (predict), or fail with a traceback after the run
    folder exists (``validate`` of I2CL, whose calibration has no validation set)."""
    if subcommand not in EVALUATION_LOOPS:
        return
    step, loader, purpose, instead = EVALUATION_LOOPS[subcommand]
    if not is_overridden(step, model, LightningModule):
        missing = f"{type(model).__name__} has no {step}"
    elif datamodule is None or not is_overridden(loader, datamodule, LightningDataModule):
        missing = f"{type(datamodule).__name__} has no {loader}"
    else:
        return
    raise ConfigError(f"{subcommand}: {missing}, so there is nothing {purpose}; {instead}")


#: The seeds ``seed_everything`` takes (numpy's range); Lightning raises a bare ``ValueError`` outside it.
SEED_RANGE = (0, 2**32 - 1)


def check_seed(seed: Any) -> None:
    """Refuse a ``seed_everything`` Lightning would reject with a traceback (``true``: a random seed; ``false``:
    none)."""
    if isinstance(seed, int) and not isinstance(seed, bool) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ConfigError(f"--seed_everything={seed} must be from {SEED_RANGE[0]} to {SEED_RANGE[1]} "
                          "(or true for Lightning's choice, PL_GLOBAL_SEED or 0; false for none)")


def check_trainer_counts(trainer: Any) -> None:
    """Refuse counts Lightning would divide by zero or take silently (see :data:`TRAINER_COUNTS`), and a zero
    ``val_check_interval``, before the trainer is built."""
    for flag, (minimum, meaning) in TRAINER_COUNTS.items():
        value = trainer.get(flag)
        if value is not None and not isinstance(value, bool) and isinstance(value, int) and value < minimum:
            raise ConfigError(f"--trainer.{flag}={value} must be >= {minimum} ({meaning})")
    interval = trainer.get("val_check_interval")
    if interval is not None and not isinstance(interval, (bool, str)) and interval <= 0:
        raise ConfigError(
            f"--trainer.val_check_interval={interval} must be > 0 (an int: training batches between validations; "
            "a float in (0, 1]: that fraction of an epoch)"
        )

def check_fit_trains(trainer: Any) -> None:
    """Refuse a ``fit`` that would train nothing (``max_steps`` or ``max_epochs`` 0). Lightning accepts it, writes the
    run folder (config, events) without a checkpoint and exits 0, so a later ``--ckpt_path last`` finds no run."""
    for flag in ("max_steps", "max_epochs"):
        if trainer.get(flag) == 0 and not isinstance(trainer.get(flag), bool):
            raise ConfigError(f"--trainer.{flag}=0 trains nothing: give a positive number (or -1 for no limit), or "
                              "use `validate` or `test` to evaluate without training")


#: Less free space than this on an output folder's disk stops a run before it starts: not even a small
#: checkpoint fits, and TensorBoard would leave an empty events file and a traceback.
MIN_FREE_BYTES = 1 << 20


def check_output_writable(trainer: Trainer) -> None:
    """Refuse output folders that cannot be created or written (read-only, or under a file), before the run
    creates them; Lightning would fail with a ``PermissionError`` after it has started. A folder on a full disk
    (under :data:`MIN_FREE_BYTES` free) is a :class:`StorageError` (the environment's, not the input's)."""
    folders: list[tuple[str, Any, Any]] = []  # (option, its value, the folder the run will write into)
    for logger in trainer.loggers:
        save_dir = getattr(logger, "save_dir", None)
        # The run's folders go under save_dir/<name>, which may exist already and be read-only itself.
        folders.append(("--trainer.logger.init_args.save_dir", save_dir, getattr(logger, "root_dir", None) or save_dir))
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint):
            folders.append(("--checkpoint.dirpath", cb.dirpath, cb.dirpath))
    if not trainer.loggers:  # with a logger, Lightning writes under the logger's folder instead
        folders.append(("--trainer.default_root_dir", trainer.default_root_dir, trainer.default_root_dir))
    for option, folder, target in folders:
        if not target or "://" in str(target):  # remote file systems are checked by their own client
            continue
        path = Path(target).absolute()
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ConfigError(f"{option} {folder}: {existing} is a file, not a folder; choose another folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{option} {folder}: {existing} is not writable; choose a folder you can write to "
                f"(e.g. {option} runs)"
            )
        usage = shutil.disk_usage(existing)
        if 0 < usage.total and usage.free < MIN_FREE_BYTES:  # pseudo file systems report a total of 0
            raise StorageError(
                f"{option} {folder}: the disk of {existing} is full ({usage.free} bytes free); free space there, "
                "or choose a folder on another disk"
            )


def check_run_folder_is_free(subcommand: str, config: Any) -> None:
    """Refuse a run whose logger is pinned to a training run's folder that the run would overwrite.

    A run writes its events, results and ``config.yaml`` into its logger's folder (replacing ``config.yaml``, as a
    fit resumed in place must). With a named version (``--trainer.logger.init_args.version s0``, as the grid
    drivers name their fits, and kept in that fit's ``config.yaml``) the folder may already hold a fit:

    - ``test``, ``validate`` or ``predict`` there would replace the fit's ``config.yaml`` with its own; a folder
      holding ``checkpoints/`` is taken for a fit's (an earlier test's folder may be written again: a grid reruns
      its unfinished tests there);
    - a ``fit`` without ``--ckpt_path`` would start afresh over the fit's ``checkpoints/last.ckpt``.

    Without a logger (``--trainer.logger false``) the folder is ``--trainer.default_root_dir``, shared by every run.
    """
    run = pinned_run_folder(config)
    option, own = "", "--trainer.logger.init_args.version null (or a new name)"
    if run is not None:
        option = f"--trainer.logger.init_args.version {run.name}"
    elif config.get("trainer") is not None and config.trainer.get("logger") in (False, []):
        # Without a logger every run writes into default_root_dir (Lightning's: the working folder), one after the
        # other: a test there replaced its fit's config.yaml and put its results beside the fit's checkpoints.
        run = Path(config.trainer.get("default_root_dir") or ".")
        option, own = "--trainer.logger false", "--trainer.default_root_dir (or keep the logger: a version each)"
    if run is None or "://" in str(run):
        return
    if subcommand in ("test", "validate", "predict") and (run / "checkpoints").is_dir():
        raise ConfigError(
            f"{option}: {run} is a training run's folder (it holds checkpoints/) and this {subcommand} would replace "
            f"its config.yaml; give it a folder of its own with {own}"
        )
    if subcommand == "fit" and config.get("ckpt_path") is None and (run / "checkpoints" / "last.ckpt").is_file():
        raise ConfigError(
            f"{option}: {run} already holds a run (checkpoints/last.ckpt) that a fresh fit would overwrite; resume "
            f"it with --ckpt_path last, or give a new run a folder of its own with {own}"
        )


def experiment_package(cls: type) -> str | None:
    """The experiment a lit_icl class belongs to: its module's package (``lit_icl.coqe.regression`` for
    ``lit_icl.coqe.regression.module``, ``lit_icl.icssl`` for ``lit_icl.icssl.image_manifolds``); ``None``
    for a class of another package (a user's own)."""
    module = getattr(cls, "__module__", "") or ""
    if not module.startswith("lit_icl."):
        return None
    return module.rpartition(".")[0]


def check_same_experiment(config: Any) -> None:
    """Refuse a data module of another experiment under a lit_icl module, before either is built.

    Built first, the data module would refuse the module's config values with a message about itself (a
    ``chunk_size`` to change), and only a successful build would reach the module's own check. A class outside
    lit_icl (a user's data module) is left to the module's contract check.
    """
    model, data = config.get("model"), config.get("data")
    if model is None or data is None:
        return
    model_cls = import_class(getattr(model, "class_path", None))
    data_cls = import_class(getattr(data, "class_path", None))
    if model_cls is None or data_cls is None:
        return
    ours, theirs = experiment_package(model_cls), experiment_package(data_cls)
    if ours is None or theirs is None or ours.startswith(theirs) or theirs.startswith(ours):
        return
    raise ConfigError(
        f"--data {data_cls.__name__} is a data module of {theirs}, but --model {model_cls.__name__} is {ours}'s "
        f"module; use a data module of {ours} (its configs under configs/ name one)"
    )

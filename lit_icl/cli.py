"""``python -m lit_icl`` / ``lit-icl``: one LightningCLI for every paper.

Model and data are chosen by ``class_path`` in the YAML (subclass mode), e.g.::

    python -m lit_icl fit  --config configs/coqe/omniglot.yaml
    python -m lit_icl fit  --config configs/coqe/omniglot.yaml --config configs/coqe/omniglot/cpu.yaml  # + an overlay
    python -m lit_icl test --config configs/coqe/omniglot.yaml --ckpt_path runs/coqe_omniglot/version_0/checkpoints/last.ckpt
    python -m lit_icl fit  --config configs/coqe/omniglot.yaml --ckpt_path last      # resume in place

The CLI names no paper: configs give full class paths, and values that data and model share are read by the
module from its data module (:meth:`lit_icl.core.module.ICLModule.bind_datamodule`), not linked here.

What this adds to a plain LightningCLI:

- reproducible runs by default (``trainer.deterministic: warn``): the same config and seed give bit-identical
  weights on CPU at any thread count, and a run killed and resumed with ``--ckpt_path last`` ends where the
  uninterrupted run ends;
- TensorBoard logging under ``runs/<name>/``, the name taken from the config files unless a config gives one
  (:func:`run_name`), and a checkpoint callback (``--checkpoint.*``) that keeps ``last.ckpt``;
- :class:`lit_icl.core.results.ResultsWriter` on every run, which writes a ``test`` run's ``results.json``,
  ``results.csv`` and figures;
- ``--ckpt_path last`` resumes the newest run of the same logger name *in its own folder* (Lightning alone
  would look into a new, empty ``version_N+1``);
- :class:`lit_icl.callbacks.finite.FiniteGuard` on every run, which stops a run whose training loss (or
  weights) stop being finite, naming the step, before a checkpoint of non-finite weights is saved;
- ``--ckpt_path best`` is the best checkpoint recorded by the newest run of the same config; ``last`` and
  ``best`` with no such run are an error that says where the CLI looked (:func:`resolve_ckpt_path`);
- bad input stops the program before anything is written, with one line ``lit_icl: error: ...`` and exit
  status 2: a ``--config`` file that is not YAML (file, line and column) or is empty; unknown keys and class
  paths (jsonargparse); a non-finite float anywhere in the config (YAML's ``.nan``/``.inf`` included); invalid
  values (:class:`ConfigError`, raised by constructors and by ``bind_datamodule``); trainer flags Lightning
  refuses (devices, strategy, limits, an accelerator this machine lacks); an output folder that cannot be
  written; a ``--ckpt_path`` that does not exist, is a folder, is not a Lightning checkpoint, was written by
  another experiment (its module or data class differs from the config's), or holds module settings that would
  silently replace the config's (:func:`check_ckpt_hparams`); a ModelCheckpoint or EarlyStopping that monitors a
  ``val/`` metric the model does not log (:func:`check_monitors`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import warnings
from argparse import ArgumentError
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_icl.callbacks.checkpoint import RunCheckpoint
from lit_icl.callbacks.compile import CompileMode, CompileNets, compile_targets
from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.callbacks.stopping import StopWhenConverged
from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.results import ResultsWriter
from lit_icl.core.validation import check_finite_tree, check_int, check_nonnegative, check_run_config

#: The logger name the CLI sets; a run that keeps it is named after its config files.
DEFAULT_RUN_NAME = "lit_icl"
#: ``ckpt_path`` values that Lightning resolves itself (``last`` and ``best`` are resolved by :func:`resolve_ckpt_path`).
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")
#: The parts of a parsed config that build objects; each is checked for non-finite floats.
BUILT_KEYS = ("model", "data", "trainer", "checkpoint", "optimizer", "lr_scheduler")


#: Trainer defaults of every lit_icl run; a config or the command line overrides any of them.
TRAINER_DEFAULTS: dict[str, Any] = {
    # Deterministic kernels: without them, two CPU runs with the same seed differ by ~1e-2 after a few dozen
    # steps (multi-threaded scatter-add in backward); the cost is measured in the README. "warn" picks the
    # deterministic kernel wherever one exists (every op we use on CPU) but only warns where none does: some CUDA
    # backward kernels (adaptive pooling, NLL loss) would otherwise stop a GPU run with an error.
    # `--trainer.deterministic true` makes those an error.
    "deterministic": "warn",
    # TensorBoard under runs/<name>/; the name comes from the config files (name_run_from_configs) unless given.
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": DEFAULT_RUN_NAME, "default_hp_metric": False},
    },
    # Training data is regenerated each epoch from the epoch number, so checkpoints at epoch ends are exact
    # resume points.
    "enable_model_summary": True,
}


class LitICLCLI(LightningCLI):
    """LightningCLI with the project's defaults and input checks (see the module docstring).

    Built with only a model and a data-module base class (``LitICLCLI(LightningModule, LightningDataModule,
    args=...)``), it has the defaults of ``python -m lit_icl``: subclass mode, seed 0, :data:`TRAINER_DEFAULTS`,
    and a run's ``config.yaml`` rewritten when it resumes in place.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # resuming in place rewrites config.yaml
        kwargs["trainer_defaults"] = {**TRAINER_DEFAULTS, **(kwargs.get("trainer_defaults") or {})}
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # RunCheckpoint: ModelCheckpoint that still knows its last.ckpt after the run folder is moved.
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        # No monitor: Lightning refreshes last.ckpt only when this callback saves, which an unmonitored one
        # does every epoch; a monitored one would leave last.ckpt behind after the best epoch.
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.save_top_k": 1})
        # The shared early-stopping rule (off unless a patience is given); see add_early_stopping.
        parser.add_argument("--early_stopping.patience", type=int | None, default=None,
                            help="stop after this many validation rounds without improvement (default: off); "
                                 "trainer.max_steps / max_epochs stay the cap")
        parser.add_argument("--early_stopping.monitor", type=str | None, default=None,
                            help="the validation metric (default: the one the config's ModelCheckpoint monitors)")
        parser.add_argument("--early_stopping.mode", type=Literal["max", "min"] | None, default=None,
                            help="max or min (default: the mode of the ModelCheckpoint on the same metric)")
        parser.add_argument("--early_stopping.min_delta", type=float, default=0.0,
                            help="the smallest change of the metric that counts as an improvement")
        # torch.compile of the module's nets (lit_icl.callbacks.compile); a run setting, not a model one, so a
        # checkpoint trained with it loads without it and the other way round.
        parser.add_argument("--compile.mode", type=CompileMode, default="off",
                            help="compile the nets with torch.compile: off (eager), auto (reduce-overhead on a GPU, "
                                 "eager on a CPU), default, reduce-overhead (CUDA graphs on a GPU), max-autotune, "
                                 "max-autotune-no-cudagraphs")
        parser.add_argument("--compile.backend", type=str, default="inductor",
                            help="the torch.compile backend (inductor; aot_eager or eager only trace)")
        parser.add_argument("--compile.fullgraph", type=bool, default=False,
                            help="fail on a graph break instead of splitting the net into several graphs")
        parser.add_argument("--early_stopping.wait_for_score", type=float | None, default=None,
                            help="never stop before the best score has passed this value (above it for max, "
                                 "below for min), e.g. 0.2 for a 10-class accuracy stuck at chance; default: off")

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        if args is None or isinstance(args, (list, tuple)):
            # jsonargparse reports a YAML syntax error without the file's name, and an empty file as
            # "Unexpected config"; read the --config files first so the error names the file and line.
            check_config_files(sys.argv[1:] if args is None else list(args))
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        config = self.config[sub] if sub else self.config
        for key in BUILT_KEYS:
            if config.get(key) is not None:
                check_finite_tree(config[key], key)
        if config.get("trainer") is not None:
            check_trainer_counts(config.trainer)
        # Runs before Lightning reads the checkpoint's hyper-parameters, so a bad path fails cleanly here.
        if sub:
            name_run_from_configs(config)
            config.ckpt_path = resolve_ckpt_path(sub, config)
            path = config.get("ckpt_path")
            if sub == "fit" and path == "last":  # resumed in place; check the file it will resume from
                path = _where_last(config)[0]
            ckpt = check_ckpt_path(None if path is None else str(path))
            if ckpt is not None:
                check_ckpt_classes(path, ckpt, config, sub)
                check_ckpt_hparams(path, ckpt, config)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except MisconfigurationException as err:
            # The checkpoint callback (--checkpoint.*) checks its arguments in __init__, before anything is written.
            raise ConfigError(trainer_error_message(err, "--checkpoint")) from err
        # Checks between objects (net vs data sizes, callback vs data) run here, before the run writes anything.
        check_run_config(self.trainer, self.model, self.datamodule)

    def before_instantiate_classes(self) -> None:
        sub = self.subcommand
        name_run_from_configs(self.config[sub] if sub else self.config)
        if sub == "fit" and self.config[sub].get("ckpt_path") == "last":
            pin_logger_version_for_resume(self.config[sub])
            # Resuming in place writes into the run's own, non-empty checkpoint folder on purpose.
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")

    def after_instantiate_classes(self) -> None:
        # The module checks the values it shares with the data module now, before any run folder exists;
        # Lightning would otherwise do it only in `setup`, after the logger has created the folder.
        if isinstance(self.model, ICLModule):
            self.model.attach_datamodule(self.datamodule)
            check_monitors(self.trainer, self.model)

    def before_fit(self) -> None:
        if isinstance(self.model, ICLModule):
            self.model.check_trainable()

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ConfigError:
            raise
        except (MisconfigurationException, ValueError, RuntimeError, TypeError) as err:
            # Lightning checks its flags (devices, strategy, max_steps, limits, accelerator) in Trainer.__init__,
            # before it writes anything; its message names the flag, often over several lines.
            raise ConfigError(trainer_error_message(err)) from err
        for callback in (ResultsWriter, FiniteGuard):
            if not any(isinstance(cb, callback) for cb in trainer.callbacks):
                trainer.callbacks.append(callback())
        sub = self.subcommand
        config = self.config[sub] if sub else self.config
        add_compile(trainer, self.model, config.get("compile"))
        quiet_progress_bar(trainer)
        if sub in (None, "fit"):
            # Only training stops early. A fit's saved config.yaml carries its early_stopping options, and
            # `test --config <that file>` must run without them (a test has no validation rounds to count).
            add_early_stopping(trainer, (self.config[sub] if sub else self.config).get("early_stopping"))
        check_output_writable(trainer)
        return trainer


def add_early_stopping(trainer: Trainer, options: Any) -> StopWhenConverged | None:
    """Add :class:`StopWhenConverged` for ``--early_stopping.*`` (nothing when ``patience`` is unset).

    The metric is ``--early_stopping.monitor`` or, by default, the config's own monitored metric: the
    ``monitor`` of its (first) monitored ModelCheckpoint, with that callback's mode. A config that monitors
    nothing needs ``--early_stopping.monitor`` and ``--early_stopping.mode``.
    """
    patience = None if options is None else options.get("patience")
    if patience is None:
        return None
    check_int("--early_stopping.patience", patience, minimum=1, hint="the number of validation rounds to wait")
    min_delta = options.get("min_delta", 0.0)
    check_nonnegative("--early_stopping.min_delta", min_delta)
    monitored = [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor]
    monitor, mode = options.get("monitor"), options.get("mode")
    if monitor is None:
        if not monitored:
            raise ConfigError(
                "--early_stopping.patience needs a validation metric, and this config's checkpoints monitor none; "
                "pass --early_stopping.monitor <metric> --early_stopping.mode max|min (e.g. val/acc max)"
            )
        monitor = monitored[0].monitor
    if mode is None:
        same = [cb.mode for cb in monitored if cb.monitor == monitor]
        if not same:
            raise ConfigError(f"--early_stopping.monitor {monitor}: no checkpoint monitors it, so its direction is "
                              "unknown; pass --early_stopping.mode max (accuracies) or min (losses)")
        mode = same[0]
    wait_for = options.get("wait_for_score")  # a non-finite value is refused with the whole config (check_finite_tree)
    callback = StopWhenConverged(monitor=monitor, patience=patience, mode=mode, min_delta=float(min_delta),
                                 wait_for_score=None if wait_for is None else float(wait_for))
    # Before the checkpoint callbacks: when they save at validation end (several rounds per epoch), a round's
    # decision must already be in the checkpoint of that round, or a run resumed from it would wait one round
    # longer than the uninterrupted run. (With one round per epoch they save later, at the epoch's end.)
    first_ckpt = next((i for i, cb in enumerate(trainer.callbacks) if isinstance(cb, ModelCheckpoint)),
                      len(trainer.callbacks))
    trainer.callbacks.insert(first_ckpt, callback)
    return callback


def add_compile(trainer: Trainer, model: LightningModule, options: Any) -> CompileNets | None:
    """Add :class:`CompileNets` for ``--compile.mode`` other than ``off`` (its arguments are checked there)."""
    mode = "off" if options is None else options.get("mode", "off")
    if mode == "off":
        return None
    callback = CompileNets(mode=mode, backend=options.get("backend", "inductor"),
                           fullgraph=bool(options.get("fullgraph", False)))
    compile_targets(model)  # a module that cannot be compiled says so now, before a run folder exists
    trainer.callbacks.append(callback)
    return callback


def quiet_progress_bar(trainer: Trainer) -> None:
    """On an accelerator, refresh Lightning's default progress bar only on logging steps.

    The bar reads its values (``train/loss``) back to the host when it refreshes, which makes the host wait for
    the device; Lightning's default refreshes at every batch. Logging reads them every ``log_every_n_steps``
    anyway, so the bar then costs no wait of its own. On a CPU a read costs nothing and the bar refreshes at
    every batch as before. A progress bar the config gives with another refresh rate is left as it is.
    """
    bar = trainer.progress_bar_callback
    if type(bar) is not TQDMProgressBar or bar.refresh_rate != 1 or trainer.strategy.root_device.type == "cpu":
        return
    every = max(int(trainer.log_every_n_steps), 1)
    trainer.callbacks[trainer.callbacks.index(bar)] = TQDMProgressBar(refresh_rate=every)


def run_name(config_paths: list[Any]) -> str:
    """The run folder's name for a base config and its overlays, e.g. ``coqe_omniglot_cpu_transformer``.

    The base is named by its path under ``configs/`` (``configs/coqe/omniglot.yaml`` -> ``coqe_omniglot``, a
    file elsewhere by its stem); each overlay adds its stem (``configs/coqe/omniglot/cpu.yaml`` -> ``_cpu``).
    """
    parts: list[str] = []
    for i, raw in enumerate(config_paths):
        path = Path(str(getattr(raw, "relative", raw)))
        if i == 0 and "configs" in path.parts[:-1]:
            under = path.parts[len(path.parts) - path.parts[::-1].index("configs") :]
            parts.append("_".join([*under[:-1], path.stem]))
        else:
            parts.append(path.stem)
    return "_".join(parts) or DEFAULT_RUN_NAME


def name_run_from_configs(config: Any) -> None:
    """Name the TensorBoard run after the ``--config`` files, unless a config or the command line names it.

    Configs therefore need no logger block, and a base with overlays gets a folder of its own
    (``runs/coqe_omniglot_cpu/`` for ``--config configs/coqe/omniglot.yaml --config configs/coqe/omniglot/cpu.yaml``).
    """
    logger = config.get("trainer", {}).get("logger") if hasattr(config, "get") else None
    init_args = getattr(logger, "init_args", None) if logger is not None else None
    paths = config.get("config") or []
    if init_args is None or not paths or getattr(init_args, "name", None) != DEFAULT_RUN_NAME:
        return
    init_args.name = run_name(list(paths))


def check_config_files(args: list[Any]) -> None:
    """Refuse a ``--config`` file that is not valid YAML (naming the file, line and problem) or that is empty.

    Only the YAML syntax is read here (``yaml.compose``); what the values mean is the parser's business. A file
    that does not exist is left to the parser, whose message already says so.
    """
    import yaml

    paths: list[str] = []
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            continue
        if arg == "--config" and i + 1 < len(args) and isinstance(args[i + 1], str):
            paths.append(args[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--config {raw} cannot be read ({type(err).__name__}: {err}); pass a UTF-8 YAML file")
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = " ".join(str(err.problem or err.context or "invalid syntax").split())
            raise ConfigError(f"--config {raw} is not valid YAML{where}: {problem}; fix that line") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"--config {raw} is not valid YAML: {' '.join(str(err).split())}") from None
        if node is None:
            raise ConfigError(
                f"--config {raw} is empty; give it the keys of a config (e.g. copy configs/coqe/regression.yaml) "
                "or drop it"
            )
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(
                f"--config {raw} holds a YAML {node.id} at its top level, not a mapping of keys "
                "(model:, data:, trainer: ...); see configs/ for examples"
            )


def check_ckpt_path(ckpt_path: str | None) -> dict[str, Any] | None:
    """Refuse a ``ckpt_path`` that is neither a special value nor an existing Lightning checkpoint.

    Returns the loaded checkpoint (on the CPU, tensors only) for a file, ``None`` for a special value.
    """
    if ckpt_path is None or ckpt_path in SPECIAL_CKPT_PATHS or str(ckpt_path).startswith("registry"):
        return None
    path = Path(ckpt_path)
    if path.is_dir():
        raise ConfigError(
            f"--ckpt_path {ckpt_path} is a folder, not a checkpoint file; pass a .ckpt file inside it "
            f"(e.g. {path / 'checkpoints' / 'last.ckpt'} for a run folder)"
        )
    if not path.is_file():
        raise ConfigError(
            f"--ckpt_path {ckpt_path} does not exist; pass an existing .ckpt file, or 'last' to resume the "
            "newest run of this config"
        )
    try:
        # Lightning reads the checkpoint with weights_only=True as well, so this is the same test it applies.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure means Lightning could not read it either
        raise ConfigError(
            f"--ckpt_path {ckpt_path} is not a PyTorch checkpoint ({type(err).__name__}); "
            "pass a .ckpt written by `python -m lit_icl fit`"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ConfigError(
            f"--ckpt_path {ckpt_path} is a torch file but not a Lightning checkpoint (no 'state_dict'); "
            "pass a .ckpt written by `python -m lit_icl fit`"
        )
    return ckpt


def _import_class(path: Any) -> Any:
    """The object a dotted class path names (old paths resolve through their aliases), or ``None``."""
    if not isinstance(path, str) or "." not in path:
        return None
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _same_class(a: str, b: str) -> bool:
    """Whether two class paths name the same class (an aliased old module path included)."""
    cls_a, cls_b = _import_class(a), _import_class(b)
    return cls_a is cls_b if cls_a is not None and cls_b is not None else a == b


def _run_config(ckpt_path: Any) -> Path | None:
    """The ``config.yaml`` of the run that wrote ``<run>/checkpoints/<file>.ckpt``, if it is there."""
    path = Path(ckpt_path).resolve().parent.parent / "config.yaml"
    return path if path.is_file() else None


def check_ckpt_classes(ckpt_path: Any, ckpt: dict[str, Any], config: Any, subcommand: str = "fit") -> None:
    """Refuse a checkpoint that another experiment wrote: its module class (or, to resume a ``fit``, its data
    class) is not the config's.

    LightningCLI records the classes in the checkpoint (``hyper_parameters._class_path``,
    ``datamodule_hyper_parameters._class_path``) and would replace the config's model with the checkpoint's,
    ending in an unrelated error much later (or, worse, running). Paths are compared as the classes they name,
    so a checkpoint written before a module moved (an aliased old path) still loads. ``test`` / ``validate`` /
    ``predict`` of the same module on another data module is a transfer evaluation (IC-SSL's Table 5 tests
    models trained on synthetic manifolds zero-shot on image manifolds) and is allowed; the model settings are
    still checked against the checkpoint's (:func:`check_ckpt_hparams`) and against the data before the run.
    """
    pairs = []
    for what, ckpt_key, config_key in (("module", "hyper_parameters", "model"), ("data", "datamodule_hyper_parameters", "data")):
        saved = (ckpt.get(ckpt_key) or {}).get("_class_path") if isinstance(ckpt.get(ckpt_key), dict) else None
        wanted = getattr(config.get(config_key), "class_path", None) if config.get(config_key) is not None else None
        if saved is None or wanted is None:
            continue
        pairs.append((what, saved, wanted, _same_class(saved, wanted)))
    if all(same for what, *_, same in pairs if what == "module" or subcommand == "fit"):
        return
    written = " with ".join(saved for _, saved, _, _ in pairs)
    built = " with ".join(wanted for _, _, wanted, _ in pairs)
    run_config = _run_config(ckpt_path)
    fix = f"test it with --config {quote(run_config)}" if run_config else "pass the config of the experiment that wrote it"
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was written by another experiment ({written}), but this config builds {built}; "
        f"{fix}, or a checkpoint of this config"
    )


def _differences(saved: Any, wanted: Any, key: str) -> list[tuple[str, Any, Any]]:
    """``(key, saved, wanted)`` for every leaf where a checkpoint's hyper-parameters and the config disagree.

    Only keys present on both sides are compared: a checkpoint of older code lacks today's new options (the
    config's default then applies) and the config spells out defaults the checkpoint may omit. ``class_path``
    values are compared as the classes they name, so aliased old module paths match.
    """
    if hasattr(wanted, "as_dict"):  # a jsonargparse Namespace
        wanted = wanted.as_dict()
    if isinstance(saved, dict) and isinstance(wanted, dict):
        if "class_path" in saved and "class_path" in wanted and not _same_class(saved["class_path"], wanted["class_path"]):
            return [(f"{key}.class_path", saved["class_path"], wanted["class_path"])]
        found = []
        for name in saved:
            if name in wanted and name != "class_path" and not str(name).startswith("_"):
                found += _differences(saved[name], wanted[name], f"{key}.{name}")
        return found
    if isinstance(saved, (list, tuple)) and isinstance(wanted, (list, tuple)):
        if len(saved) != len(wanted):
            return [(key, saved, wanted)]
        return [d for i, (a, b) in enumerate(zip(saved, wanted)) for d in _differences(a, b, f"{key}[{i}]")]
    if isinstance(saved, float) or isinstance(wanted, float):
        # 3e-4 and 0.0003 are the same setting; a float against a non-number falls through to ==.
        with contextlib.suppress(TypeError, ValueError):
            return [] if float(saved) == float(wanted) else [(key, saved, wanted)]
    return [] if saved == wanted else [(key, saved, wanted)]


def check_ckpt_hparams(ckpt_path: Any, ckpt: dict[str, Any], config: Any) -> None:
    """Refuse a config whose module hyper-parameters disagree with the checkpoint's.

    LightningCLI re-parses the model from the checkpoint's ``hyper_parameters`` (``_parse_ckpt_path``), so a
    value the config or the command line sets (``--model.init_args.net.init_args.width 128`` on a width-64
    checkpoint) would be silently replaced by the checkpoint's; on ``fit --ckpt_path last`` the weights would
    not fit. The error names each disagreement and the config that wrote the checkpoint.
    """
    saved = ckpt.get("hyper_parameters")
    wanted = config.get("model")
    if not isinstance(saved, dict) or wanted is None or not hasattr(wanted, "init_args"):
        return
    found = _differences(saved, wanted.init_args, "model.init_args")
    if not found:
        return
    shown = "; ".join(f"--{key} is {value!r} here but {old!r} in the checkpoint" for key, old, value in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    run_config = _run_config(ckpt_path)
    fix = f"use the config that wrote it (--config {quote(run_config)})" if run_config else "use the config that wrote it"
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was trained with other model settings, which would silently replace the config's: "
        f"{shown}{more}; {fix}, or drop those settings"
    )


def quote(path: Any) -> str:
    """A path as it can be pasted into a shell."""
    import shlex

    return shlex.quote(str(path))


def _logger_root(config: Any) -> Path | None:
    """``save_dir/name`` of the run's (first) logger, or ``None`` when there is none to read."""
    logger = config.trainer.get("logger") if config.get("trainer") is not None else None
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    if logger is None or isinstance(logger, bool) or not hasattr(logger, "init_args"):
        return None
    init = logger.init_args
    return Path(init.get("save_dir") or ".") / (init.get("name") or "lightning_logs")


def _newest_run_with_last(root: Path) -> Path | None:
    """The ``version_N`` folder under ``root`` with the largest N that holds ``checkpoints/last.ckpt``."""
    candidates = []
    for run in root.glob("version_*"):
        match = re.fullmatch(r"version_(\d+)", run.name)
        if match and (run / "checkpoints" / "last.ckpt").is_file():
            candidates.append((int(match.group(1)), run))
    return max(candidates)[1] if candidates else None


def _where_last(config: Any) -> tuple[Path | None, str]:
    """The ``last.ckpt`` a ``--ckpt_path last`` of this config means (``None`` if there is none), and where
    it was looked for (for the error). ``(None, "")`` when the CLI cannot tell (no logger to read)."""
    dirpath = config.checkpoint.get("dirpath") if config.get("checkpoint") is not None else None
    if dirpath:
        path = Path(dirpath) / "last.ckpt"
        return (path if path.is_file() else None), str(path)
    root = _logger_root(config)
    if root is None:
        return None, ""
    version = config.trainer.logger.init_args.get("version") if not isinstance(config.trainer.logger, list) else None
    if version is not None:
        run = root / (version if isinstance(version, str) else f"version_{version}")
        path = run / "checkpoints" / "last.ckpt"
        return (path if path.is_file() else None), str(path)
    run = _newest_run_with_last(root)
    return (run / "checkpoints" / "last.ckpt" if run is not None else None), str(root / "version_*/checkpoints/last.ckpt")


def resolve_ckpt_path(subcommand: str, config: Any) -> Any:
    """``--ckpt_path last`` / ``best`` of a fresh CLI process, resolved against this config's earlier runs.

    Lightning resolves both from the checkpoint callback of the *running* trainer, which in a new process has
    saved nothing: ``last`` would silently start from scratch (and ``test`` score an untrained model), ``best``
    fails with an unrelated error. Here:

    - ``last`` with no earlier run is an error that says where it looked; ``fit`` keeps ``last`` (the logger is
      pinned to that run's folder, :func:`pin_logger_version_for_resume`, so it resumes in place), other
      subcommands get the file's path (their results go to a new folder, as with an explicit path);
    - ``best`` is the best checkpoint that the newest run's checkpoint callback recorded in its ``last.ckpt``,
      an error when there is none.
    """
    ckpt_path = config.get("ckpt_path")
    if ckpt_path not in ("last", "best"):
        return ckpt_path
    last, looked = _where_last(config)
    if not looked:  # no logger and no checkpoint dirpath: leave it to Lightning
        return ckpt_path
    if ckpt_path == "last":
        if last is None:
            fix = ("drop --ckpt_path to start a fresh run" if subcommand == "fit"
                   else "run `python -m lit_icl fit` with this config first")
            raise ConfigError(
                f"--ckpt_path last: no earlier run of this config (looked for {looked}); {fix}, or pass a .ckpt file"
            )
        return ckpt_path if subcommand == "fit" else str(last)
    best = _best_recorded(last) if last is not None else None
    if best is None:
        raise ConfigError(
            f"--ckpt_path best: no best checkpoint of this config (looked for the checkpoint callback's best path "
            f"in {looked}); run fit first, or pass a .ckpt file"
        )
    return str(best)


def _best_recorded(last: Path) -> Path | None:
    """The existing ``best_model_path`` a ``ModelCheckpoint`` recorded in the checkpoint ``last``, if any."""
    try:
        ckpt = torch.load(last, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - an unreadable last.ckpt has no best path to offer
        return None
    states = ckpt.get("callbacks") if isinstance(ckpt, dict) else None
    for key, state in (states or {}).items():
        if str(key).startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("best_model_path"):
            path = Path(state["best_model_path"])
            for candidate in (path, last.parent / path.name):  # the run folder may have moved since
                if candidate.is_file():
                    return candidate
    return None


#: Trainer flags that Lightning divides by (a 0 ends in ZeroDivisionError after the run folder exists) or that
#: accept out-of-range values silently: flag -> (smallest value, what it means).
TRAINER_COUNTS: dict[str, tuple[int, str]] = {
    "accumulate_grad_batches": (1, "batches per optimizer step"),
    "check_val_every_n_epoch": (1, "epochs between validations; null validates by steps only"),
    "log_every_n_steps": (0, "steps between logged training metrics; 0 logs none"),
    "num_sanity_val_steps": (-1, "validation batches before training; -1 runs them all, 0 none"),
}


def check_monitors(trainer: Trainer, model: ICLModule) -> None:
    """Refuse a callback that monitors a ``val/...`` metric the model does not log.

    ModelCheckpoint and EarlyStopping look their ``monitor`` up only at the end of the first validation, after
    the run folder exists and an epoch has been trained, and then stop the run with a traceback.
    """
    keys = model.validation_keys()
    if keys is None:
        return
    for callback in getattr(trainer, "callbacks", None) or []:
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor.startswith("val/") and monitor not in keys:
            logged = ", ".join(sorted(keys)) if keys else "none (this model has no validation loop)"
            raise ConfigError(
                f"{type(callback).__name__} monitors {monitor!r}, which {type(model).__name__} does not log; "
                f"it logs {logged}"
            )


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


def trainer_error_message(err: BaseException, option: str = "--trainer") -> str:
    """One line from Lightning's error about a trainer (or checkpoint) flag, with a pointer to the flags."""
    text = " ".join(str(err).split()) or type(err).__name__
    text = re.sub(r" Find a complete list of options in our documentation at \S+", "", text)
    hint = f"fix that {option} option (python -m lit_icl fit --help lists them)"
    if re.search(r"backend|can ?not run|not available|no (gpu|cuda|mps|tpu)", text, re.IGNORECASE):
        hint = "use --trainer.accelerator auto (what this machine has) or cpu"
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    what = "checkpoint" if option == "--checkpoint" else "trainer"
    return f"invalid {what} configuration: {text}; {hint}"


def check_output_writable(trainer: Trainer) -> None:
    """Refuse output folders that cannot be created or written (read-only, or under a file), before the run
    creates them; Lightning would fail with a ``PermissionError`` after it has started."""
    folders: list[tuple[str, Any]] = []
    for logger in trainer.loggers:
        folders.append(("--trainer.logger.init_args.save_dir", getattr(logger, "save_dir", None)))
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint):
            folders.append(("--checkpoint.dirpath", cb.dirpath))
    if not trainer.loggers:  # with a logger, Lightning writes under the logger's folder instead
        folders.append(("--trainer.default_root_dir", trainer.default_root_dir))
    for option, folder in folders:
        if not folder or "://" in str(folder):  # remote file systems are checked by their own client
            continue
        path = Path(folder).absolute()
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


def pin_logger_version_for_resume(config: Any) -> None:
    """Point the logger at the newest existing run folder that has ``checkpoints/last.ckpt``.

    With an auto-incremented version Lightning would open ``version_N+1`` and find no ``last`` checkpoint
    there; pinning the version resumes the run in the folder it was written to. Nothing changes when the user
    pinned a version or a checkpoint ``dirpath`` already, or when there is nothing to resume.
    """
    if config.get("checkpoint") is not None and config.checkpoint.get("dirpath"):
        return
    root = _logger_root(config)
    if root is None:
        return
    logger = config.trainer.logger
    init = (logger[0] if isinstance(logger, list) else logger).init_args
    if init.get("version") is not None:
        return
    run = _newest_run_with_last(root)
    if run is not None:
        init.version = run.name


def main(args: ArgsType = None) -> None:
    """Entry point of ``python -m lit_icl`` and the ``lit-icl`` script."""
    torch.set_float32_matmul_precision("high")
    # Deterministic mode would also fill every new tensor with NaN to expose reads of uninitialised memory; that
    # is a debugging aid, not part of reproducibility, so it is left off (it only adds work).
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        LitICLCLI(
            LightningModule,
            LightningDataModule,
            # Parse errors are raised (not printed with the full usage) so they become one line below.
            parser_kwargs={
                "exit_on_error": False,
                **{sub: {"exit_on_error": False} for sub in LitICLCLI.subcommands()},
            },
            args=args,
        )
    except ArgumentError as err:
        print(f"lit_icl: error: {one_line_parser_error(str(err))}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:
        config_error = find_config_error(err)
        if config_error is None:
            raise
        print(f"lit_icl: error: {config_error}", file=sys.stderr)
        sys.exit(2)


def precisions() -> list[str]:
    """Every ``--trainer.precision`` value Lightning accepts, as typed on the command line."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT

    def flat(t: Any) -> list[Any]:
        args = typing.get_args(t)
        return [x for a in args for x in (flat(a) if typing.get_args(a) else [a])] if args else [t]

    return list(dict.fromkeys(str(v) for v in flat(_PRECISION_INPUT)))


def find_config_error(err: BaseException) -> ConfigError | None:
    """The :class:`ConfigError` behind ``err``, if any.

    jsonargparse re-raises errors from class constructors inside nested (sub)class arguments as a long
    multi-line ``ValueError`` chained ``from`` the original one; the original holds the one-line message.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, ConfigError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


#: Lines of a jsonargparse error that only describe the union machinery, not the user's mistake.
_PARSER_NOISE = re.compile(
    r"^(- )?(Does not validate against any of the Union subtypes|Subtypes: |Errors:|Expected a <class 'NoneType'>"
    r"|Given value type: |Given value: )"
)


def one_line_parser_error(message: str) -> str:
    """Condense a (nested, multi-line) jsonargparse error into ``<option path>: <innermost problem>``.

    jsonargparse reports a bad value deep inside ``model.init_args.net.init_args...`` as an indented tree of
    union alternatives; the user needs the path of keys and the innermost message (e.g. "Expected a
    typing.Literal['rbf', 'linear']. Got value: poly"), plus the class whose option it was.
    """
    lines = [ln.strip() for ln in message.splitlines()]
    keys: list[str] = []
    classes: list[str] = []
    problems: list[str] = []
    given: dict[int, str] = {}  # problem index -> the value reported right after it
    for ln in lines:
        value = re.fullmatch(r"Given value: (.*)", ln)
        if value and problems and len(problems) - 1 not in given:
            given[len(problems) - 1] = value.group(1)
        if not ln or _PARSER_NOISE.match(ln):
            continue
        key = re.fullmatch(r'Parser key "([^"]+)":(.*)', ln)
        if key:
            keys.append(key.group(1))
            if key.group(2).strip():  # the whole problem on one line, e.g. a --config file that does not exist
                problems.append(key.group(2).strip())
            continue
        cls = re.fullmatch(r"- Problem with given class_path '([^']+)':", ln)
        if cls:
            classes.append(cls.group(1))
            continue
        problems.append(ln.removeprefix("- "))
    if not problems:
        return " ".join(ln for ln in lines if ln)
    problem = problems[-1]
    if problem.startswith("Expected a") and "Got value" not in problem and len(problems) - 1 in given:
        problem += f". Got value: {given[len(problems) - 1]}"
    non_finite = re.fullmatch(r"Expected a <class 'float'>(?: \| None)?\. Got value: ([+-]?(?:nan|inf|infinity))", problem,
                              re.IGNORECASE)
    if non_finite:  # jsonargparse refuses nan/inf as "not a float", which they are; say what is wrong
        problem = f"{non_finite.group(1)} is not a finite number; give a finite value"
    if keys == ["trainer.precision"] and "Got value" in problem:
        problem = f"{problem.rsplit('Got value: ', 1)[1]} is not a precision; use one of {', '.join(precisions())}"
    path = ".init_args.".join(keys)
    where = f" (in {classes[-1]})" if classes and classes[-1].rsplit(".", 1)[-1] not in problem else ""
    return f"{'--' + path + ': ' if path else ''}{problem}{where}"


if __name__ == "__main__":
    main()


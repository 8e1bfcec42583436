"""The LightningCLI behind ``python -m lit_icl``: one for every paper, which names none.

    python -m lit_icl fit  --config configs/coqe/omniglot.yaml [--config configs/coqe/omniglot/cpu.yaml]
    python -m lit_icl test --config configs/coqe/omniglot.yaml --ckpt_path last

Model and data are chosen by ``class_path`` in the configs (subclass mode); values that data and model share are
read by the module from its data module (:meth:`lit_icl.core.module.ICLModule.bind_datamodule`), not linked here.
What it adds to a plain LightningCLI: deterministic kernels by default (``trainer.deterministic: warn``), so a seed
gives bit-identical CPU runs and exact resumes; TensorBoard runs named after their configs
(:mod:`~lit_icl.cli.naming`); a checkpoint callback keeping ``last.ckpt``; ``--ckpt_path last|best`` resolved
against the config's earlier runs (:mod:`~lit_icl.cli.checkpoints`); ``--early_stopping.*`` and ``--compile.*``
(:mod:`~lit_icl.cli.trainer_setup`); results files and the finite-loss guard on every run. Bad input of every
kind (YAML, keys, values, trainer flags, output folders, checkpoints, monitors; :mod:`~lit_icl.cli.checks`) stops
the program before anything is written, with one line ``lit_icl: error: ...`` and exit status 2. Checkpoints are
written atomically (:mod:`~lit_icl.core.checkpoint_io`), and a full disk ends a run with one such line (the path,
the cause, where to resume) and exit status 74.
"""

from __future__ import annotations

import logging
import signal
import sys
import warnings
from argparse import SUPPRESS, ArgumentError
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch._functorch.config  # process_defaults sets one of its options
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.trainer.states import TrainerFn, TrainerStatus
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

from lit_icl.callbacks.checkpoint import RunCheckpoint
from lit_icl.callbacks.compile import CompileMode
from lit_icl.callbacks.ddp_stop import StopTogether
from lit_icl.callbacks.eval_step import EvaluationAtTrainedStep
from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.callbacks.hparams import HParamsView
from lit_icl.callbacks.interrupt import FinishRoundOnSigterm, StopOnCtrlC, stopped_by_ctrl_c
from lit_icl.callbacks.resume import ResumeInsideEpoch
from lit_icl.cli.checkpoints import (
    check_ckpt_classes,
    check_ckpt_hparams,
    check_ckpt_path,
    check_evaluated_shapes,
    check_resume_length,
    check_resume_settings,
    check_resumed_data,
    check_resumed_ranks,
    check_resumed_rule,
    pin_logger_version_for_resume,
    resolve_ckpt_path,
    unpin_logger_version,
    where_last,
)
from lit_icl.cli.checks import (
    check_config_files,
    check_eval_shards,
    check_evaluation_loop,
    check_fit_trains,
    check_monitors,
    check_output_writable,
    check_precision_request,
    check_run_folder_is_free,
    check_same_experiment,
    check_scheduler_has_optimizer,
    check_seed,
    check_trainer_counts,
    check_val_interval,
)
from lit_icl.cli.messages import (
    find_config_error,
    find_error,
    one_line_parser_error,
    out_of_memory_message,
    overlay_hint,
    saved_config_hint,
    trainer_error_message,
)
from lit_icl.cli.naming import DEFAULT_RUN_NAME, name_run_from_configs
from lit_icl.cli.paths import expand_home
from lit_icl.cli.runlock import lock_run_folder, release_run_folders
from lit_icl.cli.trainer_setup import (
    add_compile,
    add_early_stopping,
    no_op_profiler,
    quiet_progress_bar,
    use_atomic_checkpoint_io,
)
from lit_icl.core.errors import EXIT_STORAGE, ConfigError, StorageError
from lit_icl.core.legacy import upgrade_checkpoint, upgrade_hparams
from lit_icl.core.module import UNRECORDED_NETS, ICLModule
from lit_icl.core.results import PredictionsWriter, ResultsWriter
from lit_icl.core.validation import check_finite_tree, check_run_config

#: The parts of a parsed config that build objects; each is checked for non-finite floats.
BUILT_KEYS = ("model", "data", "trainer", "checkpoint", "optimizer", "lr_scheduler")


#: Trainer defaults of every lit_icl run; a config or the command line overrides any of them.
TRAINER_DEFAULTS: dict[str, Any] = {
    # Deterministic kernels: without them, two CPU runs with the same seed differ by ~1e-2 after a few dozen
    # steps (multi-threaded scatter-add in backward); the cost is measured in the README. "warn" picks the
    # deterministic kernel wherever one exists (every op we use on CPU) but only warns where none does: a CUDA
    # backward kernel without one (torch's adaptive pooling, which avMNIST's GridPool avoids on a GPU) would
    # otherwise stop a GPU run with an error. (torch also keeps its memory-efficient attention's CUDA backward
    # non-deterministic under "warn", with a warning; only "true" makes it deterministic.)
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


#: What ``--ckpt_path`` means per subcommand, for ``--help`` (resolved by :func:`~lit_icl.cli.checkpoints.resolve_ckpt_path`).
CKPT_PATH_HELP = {
    "fit": "the checkpoint to resume from: last (the newest run of this config, continued in its own folder), best "
           "(the best checkpoint that run recorded), hpc (Lightning's SLURM requeue checkpoint) or a .ckpt file; the "
           "model and data settings must be the ones it was trained with",
    **dict.fromkeys(
        ("validate", "test", "predict"),
        "the checkpoint to evaluate: a .ckpt file, last (the last.ckpt of this config's newest run) or best (the "
        "best checkpoint that run recorded); the model is rebuilt from its settings and the results go to a new "
        "run folder",
    ),
}

#: The top of ``python -m lit_icl --help``.
DESCRIPTION = ("Train and evaluate the in-context learning experiments of lit_icl, each a config under configs/: "
               "python -m lit_icl fit --config configs/<paper>/<experiment>.yaml [--config <overlay>.yaml]")


class HeldOutput:
    """Lightning's log lines and Python warnings, held while the CLI parses the configs and builds the run.

    Parsing and building print "Seed set to 0", the GPU/TPU lines and Lightning's tips before the checks have
    run; a refusal must print its one line alone. So they are held: :meth:`release` prints them in order once the
    run starts, :meth:`drop` forgets them when the input is refused.
    """

    LOGGERS = ("lightning.pytorch", "lightning.fabric")

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []  # ("log", (logger name, record)) or ("warning", showwarning args)
        self.handlers: dict[str, list[logging.Handler]] | None = None
        self.showwarning: Any = None

    def hold(self) -> HeldOutput:
        if self.handlers is not None:  # already holding
            return self
        held = self

        class Collect(logging.Handler):
            def __init__(self, name: str) -> None:
                super().__init__()
                self.logger_name = name

            def emit(self, record: logging.LogRecord) -> None:
                held.events.append(("log", (self.logger_name, record)))

        self.handlers = {}
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            self.handlers[name] = logger.handlers[:]
            logger.handlers = [Collect(name)]
        self.showwarning = warnings.showwarning
        warnings.showwarning = lambda *args, **kwargs: held.events.append(("warning", (args, kwargs)))
        return self

    def _restore(self) -> bool:
        if self.handlers is None:
            return False
        for name, handlers in self.handlers.items():
            logging.getLogger(name).handlers = handlers
        warnings.showwarning = self.showwarning
        self.handlers = None
        return True

    def release(self) -> None:
        """Stop holding and print what was held, in order (nothing if not holding)."""
        saved = self.handlers
        if not self._restore():
            return
        for kind, event in self.events:
            if kind == "warning":
                args, kwargs = event
                warnings.showwarning(*args, **kwargs)
                continue
            name, record = event
            for handler in saved[name]:
                if record.levelno >= handler.level:
                    handler.handle(record)
        self.events.clear()

    def drop(self) -> None:
        """Stop holding and forget what was held: the input was refused, and its one line says why."""
        self._restore()
        self.events.clear()


#: What :func:`main` holds while the run is built; the CLI releases it when the run starts.
_HELD = HeldOutput()


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
        self._only_subcommand = requested_subcommand(kwargs.get("args"), self.subcommands())
        self._pinned = False  # whether the logger's version was pinned to resume in place (before_instantiate_classes)
        super().__init__(*args, **kwargs)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        # Each subcommand's parser holds every argument of the Trainer, the model and the data (all four took
        # 0.23 s per CLI over the test suite, one 0.06 s); a command line that names its subcommand only needs that
        # one. Without one, or with --help before it, all four are built, so the choices and the help list them all.
        only = self._only_subcommand
        if only is None:
            super()._add_subcommands(parser, **kwargs)
            return
        every = self.subcommands
        self.subcommands = lambda: {only: every()[only]}  # what LightningCLI loops over, for this call only
        try:
            super()._add_subcommands(parser, **kwargs)
        finally:
            del self.subcommands

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        # Lightning's help for --ckpt_path describes its own keywords ("last" of the running trainer, the model
        # registry), which is not what this CLI does with them (resolve_ckpt_path).
        for action in parser._actions:
            if action.dest == "ckpt_path":
                action.help = CKPT_PATH_HELP.get(subcommand, action.help)
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # RunCheckpoint: ModelCheckpoint that still knows its last.ckpt after the run folder is moved.
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        # Refused by RunCheckpoint (its __init__ says why and what to use), so not offered in --help; still parsed,
        # so that a user who passes it gets that one line rather than "unrecognized arguments".
        hidden = parser._option_string_actions.get("--checkpoint.save_on_exception")
        if hidden is not None:  # a Lightning without the option has nothing to hide
            hidden.help = SUPPRESS
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
        parser.add_argument("--early_stopping.wait_for_score", type=float | None, default=None,
                            help="never stop before the best score has passed this value (above it for max, "
                                 "below for min), e.g. 0.2 for a 10-class accuracy stuck at chance; default: off")
        # torch.compile of the module's nets (lit_icl.callbacks.compile); a run setting, not a model one, so a
        # checkpoint trained with it loads without it and the other way round.
        # auto by default: on a CPU the run is eager (bit-identical to off), on a GPU CUDA graphs make the step
        # 2.2-3x faster (benchmarks/gpu_suite.py); off gives eager everywhere.
        parser.add_argument("--compile.mode", type=CompileMode, default="auto",
                            help="compile the nets with torch.compile: auto (default: reduce-overhead on a GPU, "
                                 "eager on a CPU and for I2CL), off (eager), default, reduce-overhead (CUDA graphs "
                                 "on a GPU), max-autotune, max-autotune-no-cudagraphs")
        parser.add_argument("--compile.backend", type=str, default="inductor",
                            help="the torch.compile backend (inductor; aot_eager or eager only trace)")
        parser.add_argument("--compile.fullgraph", type=bool, default=False,
                            help="fail on a graph break instead of splitting the net into several graphs")

    def _dump_config(self) -> None:
        """The config as the modules' hyper-parameters record it: Lightning's dump, without checking the config a
        second time (it was checked when parsed, and nothing changed it since). On our CPU machine a command refused
        at the model's construction took 0.370 s instead of 0.461 s (``benchmarks/cli_dump.py``,
        ``experiments/results/host_time_cpu.md``)."""
        if hasattr(self, "config_dump"):
            return
        import yaml

        options = {"skip_link_targets": False, "format": "yaml", "skip_validation": True}
        try:  # keep unset (None) entries: skip_unset from jsonargparse 4.49, skip_none (deprecated there) before
            dumped = self.parser.dump(self.config, skip_unset=False, **options)
        except (TypeError, ValueError):
            dumped = self.parser.dump(self.config, skip_none=False, **options)
        self.config_dump = yaml.safe_load(dumped)
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        if args is None or isinstance(args, (list, tuple)):
            # jsonargparse reports a YAML syntax error without the file's name, and an empty file as
            # "Unexpected config"; read the --config files first so the error names the file and line.
            check_config_files(sys.argv[1:] if args is None else list(args))
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        config = self.config[sub] if sub else self.config
        expand_home(config)  # before anything reads a path (the checks below, the logger, the checkpoint callback)
        for key in BUILT_KEYS:
            if config.get(key) is not None:
                check_finite_tree(config[key], key)
        check_seed(config.get("seed_everything"))
        if config.get("trainer") is not None:
            check_trainer_counts(config.trainer)
            if sub == "fit":
                check_fit_trains(config.trainer)
        if sub == "fit":
            check_scheduler_has_optimizer(config)
        # Runs before Lightning reads the checkpoint's hyper-parameters, so a bad path fails cleanly here.
        if sub:
            name_run_from_configs(config)
            config.ckpt_path = resolve_ckpt_path(sub, config)
            path = config.get("ckpt_path")
            if sub == "fit" and path == "last":  # resumed in place; check the file it will resume from
                path = where_last(config)[0]
            ckpt = check_ckpt_path(None if path is None else str(path))
            if ckpt is not None:
                upgrade_checkpoint(ckpt)  # an older checkpoint's names compared as today's
                check_ckpt_classes(path, ckpt, config, sub)
                check_ckpt_hparams(path, ckpt, config)
                if sub == "fit":  # a resume: the same data and seed (test / validate may evaluate on others)
                    check_resume_settings(path, ckpt, config)
                    check_resume_length(path, ckpt, config)
                    self._resumed = (path, ckpt)  # what the data resolved to is checked once it is built
            if sub in ("test", "validate", "predict"):
                self._evaluated = ckpt  # what the module will score, checked once it is built
                self._evaluated_path = path

    def _parse_ckpt_path(self) -> None:
        """The checkpoint's module settings into the config, as LightningCLI does, with the class paths of moved
        files and renamed arguments made current first (:mod:`lit_icl.core.legacy`): a checkpoint of older code
        names them."""
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if not path or not Path(path).is_file():
            return
        hparams = torch.load(path, weights_only=True, map_location="cpu").get("hyper_parameters") or {}
        hparams, _ = upgrade_hparams(hparams)
        hparams.pop("_instantiator", None)
        # Nets built in Python that the checkpoint cannot rebuild: the config must give them (checked below).
        unrecorded = hparams.pop(UNRECORDED_NETS, None) or {}
        if hparams:
            if "_class_path" in hparams:  # the module's own path; the rest are its arguments
                hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
            self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
        init = self.config[sub].model.get("init_args") if self.config[sub].get("model") is not None else None
        for arg, class_path in unrecorded.items():
            given = getattr(init.get(arg) if init is not None else None, "class_path", None)
            if given != class_path:
                # The config's net would be built and then fail to load the weights, after the run folder exists.
                raise ConfigError(
                    f"--ckpt_path {path}: its {arg} ({class_path}) was built in Python from a class that does not "
                    f"record its arguments, so the checkpoint cannot rebuild it, and the config gives {given}; "
                    f"pass --model.init_args.{arg} {class_path} (with the init_args it was trained with)")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except MisconfigurationException as err:
            # The checkpoint callback (--checkpoint.*) checks its arguments in __init__, before anything is written.
            raise ConfigError(trainer_error_message(err, "--checkpoint")) from err
        except (ValueError, RuntimeError, MemoryError) as err:
            # A net or data set sized beyond the machine fails in its constructor, as 100 lines of union errors.
            memory = out_of_memory_message(err)
            if memory is None:
                raise
            raise ConfigError(memory) from err
        # Checks between objects (net vs data sizes, callback vs data) run here, before the run writes anything.
        check_run_config(self.trainer, self.model, self.datamodule)
        resumed = vars(self).pop("_resumed", None)
        if resumed is not None:
            check_resumed_data(*resumed, self.datamodule)
            check_resumed_ranks(*resumed, self.trainer)
            check_resumed_rule(*resumed, self.trainer)

    def before_instantiate_classes(self) -> None:
        sub = self.subcommand
        check_same_experiment(self.config[sub] if sub else self.config)
        name_run_from_configs(self.config[sub] if sub else self.config)
        if sub:
            check_run_folder_is_free(sub, self.config[sub])
        self._pinned = False
        if sub == "fit" and self.config[sub].get("ckpt_path") == "last":
            self._pinned = pin_logger_version_for_resume(self.config[sub]) is not None
            # Resuming in place writes into the run's own, non-empty checkpoint folder on purpose.
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")

    def after_instantiate_classes(self) -> None:
        if self._pinned:  # the logger has its folder; config.yaml keeps the version the user gave (none)
            unpin_logger_version(self.config[self.subcommand])
        # The module checks the values it shares with the data module now, before any run folder exists;
        # Lightning would otherwise do it only in `setup`, after the logger has created the folder.
        if isinstance(self.model, ICLModule):
            self.model.attach_datamodule(self.datamodule)
            if self.subcommand in (None, "fit"):  # only training validates: a test's monitors never look
                check_monitors(self.trainer, self.model, self.config[self.subcommand].get("lr_scheduler")
                               if self.subcommand else self.config.get("lr_scheduler"))
        if self.subcommand in (None, "fit"):
            check_val_interval(self.trainer, self.datamodule)
        check_evaluation_loop(self.subcommand, self.model, self.datamodule)
        evaluated = vars(self).pop("_evaluated", None)
        if isinstance(self.model, ICLModule) and self.subcommand in ("test", "validate", "predict"):
            if evaluated is not None:  # the model is bound to its data now, which may have set some of its sizes
                check_evaluated_shapes(vars(self).pop("_evaluated_path", None), evaluated, self.model,
                                       self.config[self.subcommand])
            self.model.check_checkpoint_to_evaluate(evaluated)
        check_eval_shards(self.trainer, self.datamodule, self.subcommand)

    def before_fit(self) -> None:
        if isinstance(self.model, ICLModule):
            self.model.check_trainable()
        self._run_starts()

    def before_test(self) -> None:
        self._run_starts()
        warn_untrained(self.model, self.config[self.subcommand].get("ckpt_path"))

    def before_validate(self) -> None:
        self._run_starts()

    def before_predict(self) -> None:
        self._run_starts()

    def _run_starts(self) -> None:
        """Every check has passed: lock the run's folder against a second process, and print what parsing and
        building held back (see HeldOutput)."""
        lock_run_folder(self.trainer)
        _HELD.release()

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ConfigError:
            raise
        except (MisconfigurationException, ValueError, RuntimeError, TypeError) as err:
            # Lightning checks its flags (devices, strategy, max_steps, limits, accelerator) in Trainer.__init__,
            # before it writes anything; its message names the flag, often over several lines.
            raise ConfigError(trainer_error_message(err)) from err
        check_precision_request(trainer, (self.config[self.subcommand] if self.subcommand else self.config).trainer)
        for callback in (ResultsWriter, EvaluationAtTrainedStep, HParamsView, FiniteGuard, ResumeInsideEpoch, StopTogether, StopOnCtrlC,
                         FinishRoundOnSigterm):
            if not any(isinstance(cb, callback) for cb in trainer.callbacks):
                trainer.callbacks.append(callback())
        sub = self.subcommand
        if sub == "predict" and not any(isinstance(cb, BasePredictionWriter) for cb in trainer.callbacks):
            trainer.callbacks.append(PredictionsWriter())
        config = self.config[sub] if sub else self.config
        add_compile(trainer, self.model, config.get("compile"))
        quiet_progress_bar(trainer)
        no_op_profiler(trainer)
        use_atomic_checkpoint_io(trainer)  # a full disk cannot leave a truncated last.ckpt over a complete one
        if sub in (None, "fit"):
            # Only training stops early. A fit's saved config.yaml carries its early_stopping options, and
            # `test --config <that file>` must run without them (a test has no validation rounds to count).
            add_early_stopping(trainer, (self.config[sub] if sub else self.config).get("early_stopping"), self.model,
                               self.datamodule)
        check_output_writable(trainer)
        _TRAINERS[:] = [trainer]
        return trainer


def requested_subcommand(args: ArgsType, known: Mapping[str, Any]) -> str | None:
    """The subcommand a command line names first (``fit`` in ``fit --config x.yaml``), or ``None`` when it names
    none, asks for help before it, or is not a list of strings (a dict of arguments, say)."""
    argv = sys.argv[1:] if args is None else args
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) for a in argv):
        return None
    return argv[0] if argv[0] in known else None


def process_defaults() -> None:
    """What ``python -m lit_icl`` sets for its whole process before it builds a run. A script that builds runs
    itself (``LitICLCLI(..., run=False)``, as ``benchmarks/`` do) calls it too, so it runs what the CLI runs.

    - TF32 matrix products on a GPU (``torch.set_float32_matmul_precision("high")``; fp32 CPU products are
      unchanged);
    - deterministic mode without its filling of every new tensor with NaN, which exposes reads of uninitialised
      memory: a debugging aid, not part of reproducibility, that only adds work (a kernel per new tensor on a GPU);
    - compiled graphs that apply our own autograd Functions (IC-SSL's eigenmap iterations and
      :func:`~lit_icl.core.nets.contiguous_grad`) kept in torch's AOTAutograd cache, as every other graph is.
      torch passes over such a graph by default, so each run of a compiled IC-SSL config traced and partitioned
      its training graph again, cache or not. The cache key is the graph Dynamo traced, the Function's forward
      and backward included, so an edited backward is compiled afresh (``tests/test_process_defaults.py``).
      ``TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=0`` in the environment takes precedence and turns it off.
    """
    torch.set_float32_matmul_precision("high")
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch._functorch.config.autograd_cache_allow_custom_autograd_functions = True


def warn_untrained(model: LightningModule, ckpt_path: str | None) -> None:
    """Warn (one line) that a ``test`` without ``--ckpt_path`` scores a model with trainable weights as initialised:
    its rows look like a trained model's, and only ``meta.checkpoint: null`` says otherwise. Models with nothing to
    train (the closed-form and solver baselines, tested this way on purpose) are not warned about."""
    if ckpt_path is None and any(p.requires_grad for p in model.parameters()):
        rank_zero_warn(f"testing {type(getattr(model, 'net', model)).__name__} with the weights it was initialised "
                       "with (no --ckpt_path); pass --ckpt_path runs/<run>/version_N/checkpoints/last.ckpt to test a "
                       "trained model")


#: The trainer of this process's last command (set when it is built), so that a stop can say what it left.
_TRAINERS: list[Trainer] = []


def _after_stop(trainer: Trainer | None) -> str:
    """What to do after a stopped fit: resume it if it has a ``last.ckpt``; else (stopped inside its first validation
    round, or before its first step) start it again, since ``--ckpt_path last`` would find nothing to resume.

    A stopped ``test``, ``validate`` or ``predict`` (Lightning stops their loops on SIGTERM too) saved nothing and
    has nothing to resume: it is run again as it was, ``--ckpt_path`` included. The fit's advice, to drop
    ``--ckpt_path``, would score the untrained model."""
    if trainer is not None and trainer.state.fn not in (None, "fit"):
        return (f"a {trainer.state.fn.value} writes its results only when it ends, so run the same command again "
                "(with the same --ckpt_path)")
    # Every checkpoint callback: a config's best-model one comes first and keeps no last.ckpt of its own.
    lasts = [getattr(cb, "last_model_path", "") for cb in getattr(trainer, "checkpoint_callbacks", None) or []]
    if any(last and Path(last).is_file() for last in lasts):
        return "resume with --ckpt_path last"
    return "no checkpoint was written yet, so run the same command again (without --ckpt_path) to start over"


def program_name() -> str:
    """The name usage lines and ``--help`` give the program: ``python -m lit_icl`` when run that way (argparse would
    say ``__main__.py``), else the script's own name (``lit-icl``)."""
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "python -m lit_icl" if script in ("", "__main__.py", "-c") else script


def main(args: ArgsType = None) -> None:
    """Entry point of ``python -m lit_icl`` and the ``lit-icl`` script."""
    process_defaults()
    _HELD.hold()
    try:
        LitICLCLI(
            LightningModule,
            LightningDataModule,
            # Parse errors are raised (not printed with the full usage) so they become one line below.
            parser_kwargs={
                "prog": program_name(),
                "description": DESCRIPTION,
                "exit_on_error": False,
                **{sub: {"exit_on_error": False} for sub in LitICLCLI.subcommands()},
            },
            args=args,
        )
    except SIGTERMException:
        # Lightning ends a run stopped by SIGTERM with SystemExit(None), status 0: a scheduler, a container runtime
        # or a grid driver would take the stopped run for a finished one. 128 + 15 is the shell's status for it,
        # 128 + 2 for Ctrl-C (which StopOnCtrlC turns into the same stop).
        signum, name = (signal.SIGINT, "Ctrl-C") if stopped_by_ctrl_c() else (signal.SIGTERM, "SIGTERM")
        if rank_zero_only.rank == 0:
            print(f"lit_icl: stopped by {name}; {_after_stop(_TRAINERS[-1] if _TRAINERS else None)}", file=sys.stderr)
        sys.exit(128 + signum)
    except SystemExit as stop:
        trainer = _TRAINERS[-1] if _TRAINERS else None
        if (stop.code == 1 and trainer is not None and trainer.state.status == TrainerStatus.INTERRUPTED
                and trainer.state.fn not in (None, TrainerFn.FITTING)):
            # Ctrl-C in a test, validate or predict: Lightning ends it with status 1 after "Detected
            # KeyboardInterrupt", as for a crash. A fit's Ctrl-C is StopOnCtrlC's (and a second one quits with 1).
            # Lightning also leaves Ctrl-C ignored for the rest of the process: give it back to a caller in Python.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if rank_zero_only.rank == 0:
                print(f"lit_icl: interrupted by Ctrl-C; {_after_stop(trainer)}", file=sys.stderr)
            sys.exit(128 + signal.SIGINT)
        raise
    except KeyboardInterrupt:
        # Ctrl-C before training started (parsing, building the model or the data): nothing to save.
        _HELD.release()
        print("lit_icl: interrupted by Ctrl-C before the run started", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except ArgumentError as err:
        _HELD.drop()
        argv = sys.argv[1:] if args is None else list(args)
        line = saved_config_hint(overlay_hint(one_line_parser_error(str(err)), argv), argv)
        print(f"lit_icl: error: {line}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:
        config_error = find_config_error(err)
        if config_error is not None:
            _HELD.drop()
            print(f"lit_icl: error: {config_error}", file=sys.stderr)
            sys.exit(2)
        storage_error = find_error(err, StorageError)
        if storage_error is not None:
            # A full disk or a refused write (a checkpoint, or the output folder before the run): the input is
            # fine and the run resumes once there is space, so not status 2 (see EXIT_STORAGE). Under DDP only
            # rank 0 writes checkpoints, so only it has this to say.
            _HELD.drop()
            print(f"lit_icl: error: {storage_error}", file=sys.stderr)
            sys.exit(EXIT_STORAGE)
        _HELD.release()  # not a refusal: everything printed so far may explain the failure
        raise
    finally:
        _HELD.release()  # --help, --print_config and a finished run print what was held (nothing if released)
        _TRAINERS.clear()
        release_run_folders()

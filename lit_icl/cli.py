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
- bad input stops the program before anything is written, with one line ``lit_icl: error: ...`` and exit
  status 2: unknown keys and class paths (jsonargparse), invalid values (:class:`ConfigError`, raised by
  constructors and by ``bind_datamodule``), and a ``--ckpt_path`` that does not exist or is not a Lightning
  checkpoint.
"""

from __future__ import annotations

import re
import sys
from argparse import ArgumentError
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.results import ResultsWriter
from lit_icl.core.validation import check_run_config

#: The logger name the CLI sets; a run that keeps it is named after its config files.
DEFAULT_RUN_NAME = "lit_icl"
#: ``ckpt_path`` values that Lightning resolves itself.
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")


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
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        # No monitor: Lightning refreshes last.ckpt only when this callback saves, which an unmonitored one
        # does every epoch; a monitored one would leave last.ckpt behind after the best epoch.
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.save_top_k": 1})

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        super().parse_arguments(parser, args)
        # Runs before Lightning reads the checkpoint's hyper-parameters, so a bad path fails cleanly here.
        sub = self.config.get("subcommand")
        if sub:
            check_ckpt_path(self.config[sub].get("ckpt_path"))

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        # Checks between objects (net vs data sizes, callback vs data) run here, before the run writes anything.
        check_run_config(self.trainer, self.model, self.datamodule)

    def before_instantiate_classes(self) -> None:
        sub = self.subcommand
        name_run_from_configs(self.config[sub] if sub else self.config)
        if sub == "fit" and self.config[sub].get("ckpt_path") == "last":
            pin_logger_version_for_resume(self.config[sub])

    def after_instantiate_classes(self) -> None:
        # The module checks the values it shares with the data module now, before any run folder exists;
        # Lightning would otherwise do it only in `setup`, after the logger has created the folder.
        if isinstance(self.model, ICLModule):
            self.model.attach_datamodule(self.datamodule)

    def before_fit(self) -> None:
        if isinstance(self.model, ICLModule):
            self.model.check_trainable()

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        if not any(isinstance(cb, ResultsWriter) for cb in trainer.callbacks):
            trainer.callbacks.append(ResultsWriter())
        return trainer


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


def check_ckpt_path(ckpt_path: str | None) -> None:
    """Refuse a ``ckpt_path`` that is neither a special value nor an existing Lightning checkpoint."""
    if ckpt_path is None or ckpt_path in SPECIAL_CKPT_PATHS or str(ckpt_path).startswith("registry"):
        return
    path = Path(ckpt_path)
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


def pin_logger_version_for_resume(config: Any) -> None:
    """Point the logger at the newest existing run folder that has ``checkpoints/last.ckpt``.

    With an auto-incremented version Lightning would open ``version_N+1`` and find no ``last`` checkpoint
    there; pinning the version resumes the run in the folder it was written to. Nothing changes when the user
    pinned a version or a checkpoint ``dirpath`` already, or when there is nothing to resume.
    """
    if config.get("checkpoint") is not None and config.checkpoint.get("dirpath"):
        return
    logger = config.trainer.get("logger")
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    if logger is None or isinstance(logger, bool) or not hasattr(logger, "init_args"):
        return
    init = logger.init_args
    if init.get("version") is not None:
        return
    root = Path(init.get("save_dir") or ".") / (init.get("name") or "lightning_logs")
    candidates = []
    for run in root.glob("version_*"):
        match = re.fullmatch(r"version_(\d+)", run.name)
        if match and (run / "checkpoints" / "last.ckpt").is_file():
            candidates.append((int(match.group(1)), run.name))
    if candidates:
        init.version = max(candidates)[1]


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
    except Exception as err:  # noqa: BLE001 - re-raised unless it is (or wraps) a ConfigError
        config_error = find_config_error(err)
        if config_error is None:
            raise
        print(f"lit_icl: error: {config_error}", file=sys.stderr)
        sys.exit(2)


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
    path = ".init_args.".join(keys)
    where = f" (in {classes[-1]})" if classes and classes[-1].rsplit(".", 1)[-1] not in problem else ""
    return f"{'--' + path + ': ' if path else ''}{problem}{where}"


if __name__ == "__main__":
    main()


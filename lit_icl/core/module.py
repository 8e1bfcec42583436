"""``ICLModule``: what every paper's LightningModule shares.

Three conventions live here so that each paper follows them without repeating code:

1. **Reloadable checkpoints.** :meth:`ICLModule.save_reloadable_hparams` stores the constructor arguments such
   that ``<Module>.load_from_checkpoint(path)`` rebuilds the exact trained model outside the CLI, the
   dependency-injected net included. Under ``python -m lit_icl`` the CLI hands the module its parsed config, in
   which the net is ``{"class_path": ..., "init_args": ...}``; that entry is kept, and Lightning's CLI
   instantiator rebuilds it at load time. A module built in Python from a net *object* cannot store that object
   as a hyper-parameter (it would pickle the weights into the config), so the entry is dropped there and
   ``load_from_checkpoint(path, net=...)`` takes the net.
2. **Values shared by data and model belong to the data module.** A module declares what it needs from the data
   in :meth:`ICLModule.bind_datamodule`. Lightning calls it from ``setup`` (so ``Trainer.fit(model, datamodule=dm)``
   works in Python), and the CLI calls it right after instantiating both, so an inconsistency stops the program
   before a run folder exists. The shared CLI links nothing.
3. **Results are rows, written by shared code.** In ``on_test_epoch_end`` (all ranks, after torchmetrics has
   synced) a module sets :attr:`ICLModule.test_rows` to tidy rows built with
   :func:`lit_icl.core.results.result_row` and may draw figures from them in :meth:`ICLModule.test_figures`;
   :class:`lit_icl.core.results.ResultsWriter` writes them. Modules do no file I/O.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.legacy import upgrade_checkpoint
from lit_icl.core.nets import UNWRITABLE, config_value, holds_net, public_path
from lit_icl.core.resume import check_resumed_ranks_at_load


def plain_grouped_hparams(obj: LightningModule | LightningDataModule) -> None:
    """Store arguments grouped in a dataclass (CoQE's ``NoiseSchedule``) as dicts in ``obj``'s saved
    hyper-parameters, as a config writes them: a checkpoint then holds plain values and loads with
    ``weights_only=True`` (as Lightning and the CLI read it), and ``hparams.yaml`` shows the values rather than a
    Python object. The constructor that takes the group accepts the dict back (``load_from_checkpoint``)."""
    for store in (obj.hparams, getattr(obj, "_hparams_initial", None) or {}):
        for key, value in list(store.items()):
            if is_dataclass(value) and not isinstance(value, type):
                store[key] = asdict(value)


def detached(out: Any) -> Any:
    """``out`` with each tensor detached, through tuples and NamedTuples (what the nets return)."""
    if isinstance(out, Tensor):
        return out.detach()
    if isinstance(out, tuple):
        parts = [detached(part) for part in out]
        return type(out)(*parts) if hasattr(out, "_fields") else tuple(parts)
    return out


class TrainingObjective(nn.Module):
    """A training step's net and loss as one module: ``(loss(out, *loss_args), out)`` with ``out = net(*net_args)``,
    ``out`` detached (:func:`detached`): it is there for logging and metrics, and the gradient flows through the
    loss only.

    ``--compile.mode`` compiles it as the training step's one region (:meth:`ICLModule.compile_targets`), so the
    loss and its backward run inside the compiled graphs. With the net compiled alone they ran as eager ops around
    the graphs at every step, each a kernel launch and host time on a GPU (IC-SSL's Eq. 4: 13 of them). Eager, it
    computes exactly what the step computed without it.

    It holds the net without registering it: the net's weights stay where they are (the module's ``net``), and
    checkpoints, the model summary and ``.to()`` see nothing new.
    """

    def __init__(self, net: nn.Module, loss: Callable[..., Tensor]) -> None:
        super().__init__()
        object.__setattr__(self, "net", net)  # not a submodule (see the class docstring)
        self.loss = loss

    def forward(self, net_args: tuple[Any, ...], loss_args: tuple[Any, ...]) -> tuple[Tensor, Any]:
        out = self.net(*net_args)
        # Detached, the output is no output of the compiled backward: otherwise that backward takes a gradient
        # for it, which nothing computes, so a zero fill per output tensor ran at every step.
        return self.loss(out, *loss_args), detached(out)


@functools.cache
def objective_class(module_class: type) -> type[TrainingObjective]:
    """The :class:`TrainingObjective` of ``module_class``'s modules: a subclass whose ``forward`` is a code object of
    its own (named ``<module class>.training_objective`` in tracebacks and profiles).

    Dynamo keeps what it compiled for a function on the function's code object, and compiles one code object at
    most ``torch._dynamo.config.recompile_limit`` times (8) in a process; after that it runs it eager, or fails
    under ``fullgraph``. Every paper's objective sharing one ``forward`` would spend that limit across papers, as
    each net and loss is a compilation of its own; one code object per module class keeps each paper's count its
    own, as each net's ``forward`` does.
    """
    base = TrainingObjective.forward
    # replace() always makes a new code object; Python 3.11+ also names it after the module class.
    qualname = f"{module_class.__qualname__}.training_objective"
    code = base.__code__.replace(co_qualname=qualname) if sys.version_info >= (3, 11) else base.__code__.replace()
    forward = types.FunctionType(code, base.__globals__, base.__name__, base.__defaults__, base.__closure__)
    forward.__doc__, forward.__annotations__ = base.__doc__, base.__annotations__
    name = f"{module_class.__name__}Objective"
    return type(name, (TrainingObjective,), {"forward": forward, "__module__": module_class.__module__,
                                              "__qualname__": name})


#: The hyper-parameter naming the nets a module was given in Python whose construction is unknown (see
#: :meth:`ICLModule.save_reloadable_hparams`): ``{argument: class path}``.
UNRECORDED_NETS = "_unrecorded_nets"


def _take_unrecorded_nets(checkpoint: dict[str, Any], path: Any, cls: type, kwargs: dict[str, Any]) -> bool:
    """Remove :data:`UNRECORDED_NETS` from a checkpoint about to be loaded, refusing it in one line unless
    ``kwargs`` gives each of those nets; whether the checkpoint changed."""
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict) or UNRECORDED_NETS not in hparams:
        return False
    missing = {k: v for k, v in hparams.pop(UNRECORDED_NETS).items() if k not in kwargs}
    if missing:
        given = ", ".join(f"{k}=<the {v.rsplit('.', 1)[-1]} it was trained with>" for k, v in missing.items())
        raise ConfigError(
            f"{path}: its {', '.join(f'{k} ({v})' for k, v in missing.items())} was built in Python from a class "
            f"that does not record its arguments, so the checkpoint cannot rebuild it; pass it: "
            f"{cls.__name__}.load_from_checkpoint(path, {given})"
        )
    return True


def _class_paths(value: Any, key: str) -> list[tuple[str, str]]:
    """``(hyper-parameter key, class path)`` of every ``{"class_path": ...}`` in a checkpoint's hyper-parameters."""
    found = []
    if isinstance(value, dict):
        if isinstance(value.get("class_path"), str):
            found.append((key, value["class_path"]))
        for name, item in value.items():
            if name != "class_path":
                found += _class_paths(item, f"{key}.init_args.{name}" if "class_path" in value else name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found += _class_paths(item, f"{key}[{i}]")
    return found


def _check_classes_import(checkpoint: dict[str, Any], path: Any, cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse in one line a checkpoint whose recorded nets name a class that cannot be imported here (a net of
    the user's own whose file is not on ``sys.path``, or one defined in a script, recorded as ``__main__.X``).
    jsonargparse would fail with five chained tracebacks whose last says only that ``module.net`` "does not
    validate against any of the Union subtypes". Arguments given in ``kwargs`` replace the recorded ones."""
    import importlib

    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict):
        return
    for key, class_path in _class_paths({k: v for k, v in hparams.items()
                                         if k not in kwargs and not str(k).startswith("_")}, ""):
        module, _, name = class_path.rpartition(".")
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as err:
            where = ("it was defined in the script that trained it; move it into a file of its own and import it "
                     "from there (checkpoints record that import path), or"
                     if module == "__main__" else f"put the folder that holds {module} on sys.path (PYTHONPATH), or")
            arg = key.split(".", 1)[0].split("[", 1)[0]
            raise ConfigError(
                f"{path}: its {key} is {class_path}, which cannot be imported here ({err}); {where} pass it: "
                f"{cls.__name__}.load_from_checkpoint(path, {arg}=<the {arg} it was trained with>)"
            ) from None


class ICLModule(LightningModule):
    """Base class of the paper modules (see the module docstring for the conventions it carries)."""

    #: The loss of a training step, ``training_loss(net output, *loss_args)``, for a module whose step is "the net,
    #: then a loss" (:attr:`training_objective`); ``None`` for one whose step does more between the two.
    training_loss: Callable[..., Tensor] | None = None

    #: The ``--trainer.precision`` values (Lightning's names) the module runs in, or ``None`` for every one, and why
    #: the others are not. A ``*-true`` precision casts the weights and the batch, not the tensors a step makes
    #: itself, which then meet weights of another dtype; the paper modules list what they were run in.
    precisions: tuple[str, ...] | None = None
    precisions_why: str = ""

    def __init__(self) -> None:
        super().__init__()
        #: Tidy result rows of the last ``test`` epoch (see :func:`lit_icl.core.results.result_row`).
        self.test_rows: list[dict[str, Any]] = []
        self._trained_steps: int | None = None
        self._bound_datamodule: LightningDataModule | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets `_current_fx_name` (the running hook's name, or None) twice around each of the about 60
        # hook calls of a training step. nn.Module.__setattr__ checks every assignment against its parameters,
        # buffers and submodules: for this plain string, about 45 us of host time per step on our CPU machine
        # (benchmarks/loop_overhead.py), which a small GPU step under CUDA graphs waits on. The name is never a
        # parameter, buffer or submodule, so storing it directly is what nn.Module would do after its checks.
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        # The training objective is a cache made again on first use; its class (objective_class) is made at run
        # time, so pickle (DDP spawn, torch.save of a module) could not find it by name.
        state = super().__getstate__()
        state.pop("_training_objective", None)
        return state

    # ------------------------------------------------------------------ hyper-parameters
    def save_reloadable_hparams(self) -> None:
        """``save_hyperparameters()`` that keeps the nets in the form a config gives them.

        Call it from the subclass's ``__init__`` in place of ``save_hyperparameters``. Through the CLI the nets
        arrive as their config (``class_path``, ``init_args``). A net *object* given in Python is written the same
        way when its construction was recorded (:class:`lit_icl.core.nets.RecordedNet`, the papers' nets), so
        ``load_from_checkpoint`` and ``test --ckpt_path`` rebuild it as it was. Any other net object is left out
        and named under ``_unrecorded_nets``: loading such a checkpoint then asks for it (:meth:`load_from_checkpoint`).
        """
        with warnings.catch_warnings():
            # The warning is about exactly the entries replaced below.
            warnings.filterwarnings("ignore", message=r".*is an instance of `nn.Module`")
            save_init_hparams(self, up=2)  # the subclass's __init__, which called this
        objects = {k: v for k, v in self.hparams.items() if holds_net(v)}
        unrecorded = {}
        for key, value in objects.items():
            config = config_value(value)
            if config is UNWRITABLE:
                del self.hparams[key]
                unrecorded[key] = public_path(type(value)) if isinstance(value, nn.Module) else type(value).__name__
            else:
                self.hparams[key] = config
        if objects:
            # What the CLI records of a module it built, so that the checkpoint is read back the same way.
            self.hparams.setdefault("_class_path", public_path(type(self)))
            self.hparams.setdefault("_instantiator", "lightning.pytorch.cli.instantiate_module")
        if unrecorded:
            self.hparams[UNRECORDED_NETS] = unrecorded
        plain_grouped_hparams(self)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Lightning's ``load_from_checkpoint``, for checkpoints of older code too: the class paths of moved
        files that such a checkpoint records are made current first (:mod:`lit_icl.core.legacy`)."""
        if isinstance(checkpoint_path, (str, os.PathLike)) and Path(checkpoint_path).is_file():
            try:  # what Lightning itself can read; anything else is left to its own loading and errors
                checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
            except Exception:  # noqa: BLE001
                checkpoint = None
            changed = False
            if isinstance(checkpoint, dict):
                changed = upgrade_checkpoint(checkpoint)  # moved classes' paths made current, then checked
                _check_classes_import(checkpoint, checkpoint_path, cls, kwargs)
                changed |= _take_unrecorded_nets(checkpoint, checkpoint_path, cls, kwargs)
            if changed:
                buffer = io.BytesIO()
                torch.save(checkpoint, buffer)
                buffer.seek(0)
                checkpoint_path = buffer
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def check_config(self, *, trainer: Any = None, **_: Any) -> None:
        """Refuse a ``--trainer.precision`` outside :attr:`precisions` before the run starts: it failed at the first
        step with a dtype mismatch, or ran with values it could not hold, after the run folder was written."""
        precision = str(getattr(trainer, "precision", "32-true"))
        if self.precisions is not None and precision not in self.precisions:
            raise ConfigError(
                f"--trainer.precision {precision}: {type(self).__name__} runs in {', '.join(self.precisions)} "
                f"({self.precisions_why}); use bf16-mixed for speed, 32-true for exact float32")

    # ------------------------------------------------------------------ data binding
    def bind_datamodule(self, datamodule: LightningDataModule) -> None:
        """Read (and check against the module's own arguments) the values the data module owns.

        Override in a paper module; raise :class:`lit_icl.core.errors.ConfigError` on an inconsistency. It may
        be called twice with the same data module (by the CLI, then from ``setup``), so keep it idempotent.
        """

    def attach_datamodule(self, datamodule: LightningDataModule | None) -> None:
        """Call :meth:`bind_datamodule` once per data module object."""
        if datamodule is None or datamodule is self._bound_datamodule:
            return
        self.bind_datamodule(datamodule)
        self._bound_datamodule = datamodule

    def validation_keys(self) -> set[str] | None:
        """The ``val/...`` metric names this module logs in validation (after :meth:`bind_datamodule`), or
        ``None`` when not declared. The CLI checks a callback's ``monitor`` (ModelCheckpoint, EarlyStopping)
        against it before the run starts; Lightning would stop the run only at the first validation end."""
        return None

    def setup(self, stage: str) -> None:
        trainer = self._trainer
        self.attach_datamodule(getattr(trainer, "datamodule", None) if trainer is not None else None)
        if stage == "fit":
            self.check_trainable()

    def check_trainable(self) -> None:
        """Refuse to ``fit`` a model with nothing to train (a baseline such as a closed-form solver).

        The CLI calls it before ``fit`` starts, so the refusal comes before a run folder exists.
        """
        if not any(p.requires_grad for p in self.parameters()):
            name = type(getattr(self, "net", self)).__name__
            raise ConfigError(f"{name} has no trainable parameters; evaluate it with `test` instead of `fit`")

    # ------------------------------------------------------------------ compilation
    #: ``dynamic`` for ``torch.compile`` of the targets: ``False`` compiles one graph per input shape, which CUDA
    #: graphs need and a config's fixed step shapes allow; ``None`` lets torch generalise to dynamic shapes.
    compile_dynamic: bool | None = False
    #: Whether ``--compile.mode auto`` compiles on a CUDA device (``False``: eager everywhere).
    compile_auto: bool = True

    def compile_targets(self) -> list[nn.Module]:
        """The nets that ``--compile.mode`` compiles (:class:`lit_icl.callbacks.compile.CompileNets`).

        Each is compiled in place, so it must be a module whose ``__call__`` the steps call: by default the
        module's ``net``, and before it the :attr:`training_objective` of a module with a :attr:`training_loss`
        (its training step's one region, the loss inside). A module whose evaluation calls parts of its net one by
        one names those parts; one whose net cannot be compiled raises :class:`ConfigError` saying why.
        """
        net = getattr(self, "net", None)
        if not isinstance(net, nn.Module):
            raise ConfigError(f"{type(self).__name__} has no `net` to compile; run without --compile.mode")
        return [net] if self.training_loss is None else [self.training_objective, net]

    @property
    def training_objective(self) -> TrainingObjective:
        """The :class:`TrainingObjective` of the module's ``net`` and :attr:`training_loss`, which the training step
        calls as ``loss, out = self.training_objective(net_args, loss_args)``; made again if ``net`` is replaced."""
        if self.training_loss is None:
            raise TypeError(f"{type(self).__name__} defines no training_loss, so it has no training_objective")
        made = self.__dict__.get("_training_objective")
        if made is None or made.net is not self.net:
            made = objective_class(type(self))(self.net, self.training_loss)
            self.__dict__["_training_objective"] = made  # a plain attribute: not a submodule, not in state_dict
        return made

    # ------------------------------------------------------------------ logging
    @property
    def logging_step(self) -> bool:
        """Whether the values this training step logs reach the loggers.

        Lightning writes a training step's logged values every ``log_every_n_steps`` training batches (and at
        every step of a ``fast_dev_run``); a value logged at another step is overwritten before anything reads
        it. Each ``self.log`` call costs host time, about 0.4 ms on our CPU machine
        (``benchmarks/log_overhead.py``): Lightning moves its record of the value to the value's device at every
        call. Under CUDA graphs that is more than the GPU needs for a whole IC-SSL step. So the training steps
        log, and compute what they compute only to log, on these steps only; the written series are unchanged.
        Outside a Trainer (a bare loop) nothing is logged, and this is False.

        The decision is Lightning's own (``_LoggerConnector.should_update_logs``, which counts batches that
        stepped the optimizers, as a module with several optimizers needs), so the two cannot disagree.
        """
        trainer = self._trainer
        if trainer is None:
            return False
        return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)

    def log_loss(self, name: str, loss: Tensor, **kwargs: Any) -> None:
        """Log a training loss on logging steps (:attr:`logging_step`), and show it in the progress bar.

        Lightning turns every value logged with ``prog_bar=True`` into a Python number after *every* training
        batch (``_LoggerConnector.on_batch_end``), whether or not a progress bar is shown. On a GPU that read is
        a device sync per step: the host cannot queue the next step while the GPU runs this one, so Python's and
        Lightning's time per step adds to the GPU's instead of hiding behind it. So ``name`` goes to the loggers
        on the logging steps (on the device; Lightning reads it back when it writes), and the progress bar gets
        a host copy of the loss, under ``name`` without its ``train/`` prefix, on the first step and on the
        logging steps; with no progress bar it gets nothing. The written series and the training are unchanged.

        Args:
            name: the logged name, e.g. ``train/loss``.
            loss: a scalar tensor.
            **kwargs: further :meth:`log` arguments for the logged value (e.g. ``batch_size``).
        """
        logging = self.logging_step
        if logging:
            self.log(name, loss, **kwargs)
        trainer = self._trainer
        if trainer is None or getattr(trainer, "progress_bar_callback", None) is None:
            return
        if logging or trainer.fit_loop.epoch_loop._batches_that_stepped == 0:
            bar = name.removeprefix("train/")
            self.log(bar, loss.detach().float().cpu(), prog_bar=True, logger=False,
                     batch_size=kwargs.get("batch_size"))

    # ------------------------------------------------------------------ results
    @property
    def trained_steps(self) -> int:
        """Optimizer steps behind the current weights (a ``test`` run's own step counter starts at 0)."""
        # After a resumed `fit` the loop's counter is ahead of the loaded checkpoint's; in `test` it is 0.
        return max(int(self.global_step), int(self._trained_steps or 0))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A fit resumed on another number of DDP ranks is refused here too, for a Trainer driven from Python (the CLI
        # refused it before anything was written); subclasses call this first, before they read the checkpoint.
        check_resumed_ranks_at_load(self._trainer, checkpoint)
        self._trained_steps = checkpoint.get("global_step")

    def check_checkpoint_to_evaluate(self, checkpoint: Mapping[str, Any] | None) -> None:
        """Refuse (:class:`~lit_icl.core.errors.ConfigError`) a checkpoint that ``test``, ``validate`` or
        ``predict`` cannot score, before a run folder exists. The CLI passes the ``--ckpt_path`` checkpoint as
        loaded, or ``None`` without one. Every checkpoint of a module's own class is scored by default; I2CL
        refuses coefficients whose calibration has not run to its end."""

    def test_figures(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Figures drawn from the test rows: ``{file stem: matplotlib Figure}`` (none by default)."""
        return {}

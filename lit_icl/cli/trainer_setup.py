"""What the CLI adds to a built trainer: the shared early-stopping rule, compiled nets, a progress bar that
does not make the host wait for the device or spend its time at every batch, a default profiler that costs
no time per hook call, and checkpoint files written atomically."""

from __future__ import annotations

import contextlib
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from lightning.pytorch.profilers import PassThroughProfiler

from lit_icl.callbacks.compile import CompileNets, compile_targets, resolve_mode
from lit_icl.callbacks.stopping import StopWhenConverged
from lit_icl.core.checkpoint_io import AtomicCheckpointIO
from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.validation import check_int, check_nonnegative


def add_early_stopping(trainer: Trainer, options: Any, model: LightningModule | None = None,
                       datamodule: LightningDataModule | None = None) -> StopWhenConverged | None:
    """Add :class:`StopWhenConverged` for ``--early_stopping.*`` (nothing when ``patience`` is unset).

    The metric is ``--early_stopping.monitor`` or, by default, the config's own monitored metric: the
    ``monitor`` of its (first) monitored ModelCheckpoint, with that callback's mode. A config that monitors
    nothing needs ``--early_stopping.monitor`` and ``--early_stopping.mode``; the refusal names the metrics
    ``model`` logs in validation (its ``validation_keys()`` once bound to ``datamodule``), since they differ
    between papers.
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
                "pass --early_stopping.monitor <metric> --early_stopping.mode max|min"
                + _logged_metrics(model, datamodule)
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

def _logged_metrics(model: LightningModule | None, datamodule: LightningDataModule | None = None) -> str:
    """The tail of the no-metric refusal: what ``model`` logs in validation, or that it never validates."""
    if isinstance(model, ICLModule) and datamodule is not None:
        # Some keys come from the data (IC-SSL's label ratios); a binding error is refused later on its own.
        with contextlib.suppress(ConfigError):
            model.attach_datamodule(datamodule)
    keys_of = getattr(model, "validation_keys", None)
    keys = keys_of() if callable(keys_of) else None
    if keys is None:
        return " (max for accuracies, min for errors and losses)"
    name = type(model).__name__
    if not keys:
        return f"; but {name} has no validation rounds, so there is nothing to stop on: drop --early_stopping.patience"
    return f"; {name} logs {', '.join(sorted(keys))} (max for accuracies, min for errors and losses)"


def add_compile(trainer: Trainer, model: LightningModule, options: Any) -> CompileNets | None:
    """Add :class:`CompileNets` for ``--compile.mode`` other than ``off`` (its arguments are checked there)."""
    mode = "off" if options is None else options.get("mode", "off")
    if mode == "off":
        return None
    callback = CompileNets(mode=mode, backend=options.get("backend", "inductor"),
                           fullgraph=bool(options.get("fullgraph", False)))
    if resolve_mode(mode, trainer.strategy.root_device, model) == "off":
        return None  # auto on a CPU, or for a module that auto leaves eager (I2CL): the eager run, unchanged
    compile_targets(model)  # a module that cannot be compiled says so now, before a run folder exists
    trainer.callbacks.append(callback)
    return callback

class LoggingStepsRichBar(RichProgressBar):
    """Lightning's Rich progress bar, brought up to date on logging steps and at an epoch's last batch only.

    Lightning's Rich bar updates its task and its metrics at every training batch, whatever its refresh rate
    (refreshes per second of its display): 0.2-0.4 ms of host time per step on our CPU machine
    (``benchmarks/log_overhead.py``), which a GPU step under CUDA graphs waits on. The values it shows (the loss)
    change on logging steps only (``log_loss``).
    """

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every = max(int(trainer.log_every_n_steps), 1)
        if (batch_idx + 1) % every == 0 or batch_idx + 1 >= self.total_train_batches:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def _is_lightnings_default_rich_bar(bar: Any) -> bool:
    """Whether ``bar`` is the Rich bar Lightning adds by itself (its settings all default), not one a config
    gives."""
    if type(bar) is not RichProgressBar:
        return False
    try:
        return vars(bar) == vars(RichProgressBar())
    except ModuleNotFoundError:  # rich is not installed (then Lightning would not have made one)
        return False


def quiet_progress_bar(trainer: Trainer) -> None:
    """On an accelerator, bring Lightning's default progress bar up to date only on logging steps.

    Lightning's default bar (Rich's when ``rich`` is installed, else tqdm's) updates at every batch: host time a
    GPU step waits on (0.2-0.4 ms a step on our CPU machine), and for values that change on logging steps
    only. tqdm's then refreshes every ``log_every_n_steps`` batches; Rich's becomes a
    :class:`LoggingStepsRichBar`. On a CPU the bar updates at every batch as before. A progress bar the config
    gives with settings of its own is left as it is.
    """
    bar = trainer.progress_bar_callback
    if bar is None or trainer.strategy.root_device.type == "cpu":
        return
    if type(bar) is TQDMProgressBar and bar.refresh_rate == 1:
        every = max(int(trainer.log_every_n_steps), 1)
        trainer.callbacks[trainer.callbacks.index(bar)] = TQDMProgressBar(refresh_rate=every)
    elif _is_lightnings_default_rich_bar(bar):
        trainer.callbacks[trainer.callbacks.index(bar)] = LoggingStepsRichBar()


class NoOpProfiler(PassThroughProfiler):
    """Lightning's default profiler (``PassThroughProfiler``, which records nothing), without a context manager
    made per hook call.

    Lightning wraps each of the about 60 hook calls of a training step in ``trainer.profiler.profile(name)``.
    The base class's ``profile`` is a generator-based context manager, so the default profiler builds and runs a
    generator at every call only to do nothing: about 40 us of host time per step on our CPU machine with the main
    command's callbacks (``benchmarks/loop_overhead.py``), which a small GPU step under CUDA graphs waits on. Here
    ``profile`` hands out one shared no-op context instead. Everything else is ``PassThroughProfiler``'s.
    """

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return self._NOTHING


def no_op_profiler(trainer: Trainer) -> None:
    """Give a trainer left with Lightning's default profiler the :class:`NoOpProfiler`; a profiler the command
    line or config names (``--trainer.profiler simple``) is left as it is."""
    if type(trainer.profiler) is PassThroughProfiler:
        trainer.profiler = NoOpProfiler()


def use_atomic_checkpoint_io(trainer: Trainer) -> None:
    """Write the trainer's checkpoints with :class:`~lit_icl.core.checkpoint_io.AtomicCheckpointIO` where it
    would use Lightning's plain ``TorchCheckpointIO`` (also as the base of a wrapping plugin such as
    ``AsyncCheckpointIO``). A checkpoint plugin the config names, or a strategy's own (XLA's), is left as it is."""
    strategy = trainer.strategy
    current = strategy.checkpoint_io  # Lightning's default is made on first access
    if type(current) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(current, _WrappingCheckpointIO) and type(current.checkpoint_io) is TorchCheckpointIO:
        current._checkpoint_io = AtomicCheckpointIO()  # its setter keeps a base once set

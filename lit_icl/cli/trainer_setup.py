"""What the CLI adds to a built trainer: the shared early-stopping rule, compiled nets, a progress bar that
does not make the host wait for the device."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

from lit_icl.callbacks.compile import CompileNets, compile_targets
from lit_icl.callbacks.stopping import StopWhenConverged
from lit_icl.core.errors import ConfigError
from lit_icl.core.validation import check_int, check_nonnegative


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

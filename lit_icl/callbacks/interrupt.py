"""``StopOnCtrlC``: Ctrl-C stops a fit as a preemption does, after the training step it is in, with ``last.ckpt``;
``FinishRoundOnSigterm``: SIGTERM in a fit's validation round stops it after the round, with ``last.ckpt``.

Lightning turns Ctrl-C (SIGINT) into a ``KeyboardInterrupt`` wherever the training thread happens to be, e.g.
half-way through an optimizer step, then shuts down with status 1 and saves nothing: a researcher who stops a run
at a terminal loses every step since the last epoch's checkpoint. During ``fit`` this callback, which the CLI adds
to every run, makes the first Ctrl-C a request to stop, handled exactly as SIGTERM is (Lightning's flag for it, or
under DDP :class:`~lit_icl.callbacks.StopTogether`'s vote): the fit stops between two training batches,
:class:`~lit_icl.callbacks.RunCheckpoint` writes ``last.ckpt`` at the step reached, and the command exits with
status 130 (128 + SIGINT, the shell's status for Ctrl-C) and one line saying how to resume. A resumed run ends
bit-identical to one that was not stopped. Ctrl-C during a validation round (where Lightning would stop inside the
round, with nothing to save) stops after the round instead, as SIGTERM does (:class:`FinishRoundOnSigterm`). A
second Ctrl-C quits at once, the Lightning way, without saving.

A process started with SIGINT ignored (a background job of a script, ``nohup``) keeps it ignored, and another
program's handler is left in place: only Python's default handler is replaced, from the start of training (its
sanity check) to the end of ``fit``. Before that (parsing, building the model and data, ``prepare_data``) Ctrl-C
quits as usual: there is nothing new to save yet.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lit_icl.callbacks.ddp_stop import StopTogether

__all__ = ["FinishRoundOnSigterm", "StopOnCtrlC", "stopped_by_ctrl_c"]

#: Set when Ctrl-C asked this process's fit to stop, so that the CLI's exit names it (status 130, not 143).
_CTRL_C = threading.Event()


def stopped_by_ctrl_c() -> bool:
    """Whether the stop that ended this process's last fit was asked for by Ctrl-C (rather than SIGTERM)."""
    return _CTRL_C.is_set()


class StopOnCtrlC(Callback):
    """During ``fit``, the first Ctrl-C stops training after the current step, with a checkpoint (module doc)."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._installed = False
        self._pending = False  # Ctrl-C came during a validation round: stop when it ends

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        _CTRL_C.clear()
        self._pending = False

    # Installed once Lightning has registered its own handlers (after ``on_fit_start``): registering resets its
    # SIGTERM flag, and Lightning restores at the fit's end the handlers it found then, so ours must not be among them.
    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def _install(self, trainer: Trainer) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():  # main thread only
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # ignored, or someone else's
            return
        self._trainer = trainer
        signal.signal(signal.SIGINT, self._request_stop)
        self._installed = True

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        if _CTRL_C.is_set():  # the second Ctrl-C: quit now, without a checkpoint
            raise KeyboardInterrupt
        _CTRL_C.set()
        trainer = self._trainer
        assert trainer is not None
        if trainer.validating or trainer.sanity_checking:
            # Lightning would stop inside the round, where there is no state to save: finish the round first.
            self._pending = True
            rank_zero_info("\nCtrl-C: stopping after this validation round and saving last.ckpt "
                           "(press Ctrl-C again to quit at once, without saving)")
            return
        rank_zero_info("\nCtrl-C: stopping after this training step and saving last.ckpt "
                       "(press Ctrl-C again to quit at once, without saving)")
        self._stop(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._pending:
            self._pending = False
            self._stop(trainer)

    @staticmethod
    def _stop(trainer: Trainer) -> None:
        """Stop ``trainer`` before its next training batch, as SIGTERM does."""
        votes = [cb for cb in trainer.callbacks if isinstance(cb, StopTogether) and cb.voting]
        if votes:  # DDP: the ranks agree before the next batch (a rank Ctrl-C did not reach stops too)
            votes[0].request_stop()
        else:  # one process: Lightning's own SIGTERM flag, read before the next batch
            trainer._signal_connector.received_sigterm = True

    def _restore(self) -> None:
        if (self._installed and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) == self._request_stop):  # still ours
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._installed = False
        self._trainer = None

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()


class FinishRoundOnSigterm(Callback):
    """SIGTERM during a fit's validation round stops the fit after the round, with ``last.ckpt`` at the step reached.

    Lightning stops a single-process fit inside the round, where there is no state to save
    (:class:`~lit_icl.callbacks.RunCheckpoint` writes none there), and a round at an epoch's end comes before the
    epoch's checkpoint: a preemption that landed in it lost the whole epoch (every step since the last
    ``last.ckpt``), where one a step earlier or later lost nothing. Here the signal is held for the rest of the
    round and handed to Lightning when the round ends; the training loop then stops before its next batch and
    ``RunCheckpoint`` saves that step, as for a SIGTERM between two training batches. This is what Ctrl-C
    (:class:`StopOnCtrlC`) and a DDP fit (:class:`~lit_icl.callbacks.StopTogether`, which votes after the round) do
    already; a DDP fit is left to that vote. The sanity check's round stops at once: nothing is trained yet. A
    second SIGTERM in the same round stops the fit inside it at once, without a new checkpoint.
    """

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._in_round = False  # inside a fit's validation round (not the sanity check): SIGTERM waits
        self._held = False  # a SIGTERM came in the round
        self._notify: Callable[[int, FrameType | None], Any] | None = None  # Lightning's notifier, handed the signal

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning registers its SIGTERM handler after the setup hooks, with the connector's notifier as it is
        # then: an instance attribute shadows it for this trainer only (StopTogether does the same under DDP).
        connector = trainer._signal_connector
        voting = any(isinstance(cb, StopTogether) and cb.voting for cb in trainer.callbacks)
        if stage != "fit" or voting or not hasattr(connector, "_sigterm_notifier_fn"):
            return
        self._trainer, self._in_round, self._held = trainer, False, False
        notify = connector._sigterm_notifier_fn

        def notice(signum: int, frame: FrameType | None) -> None:
            if self._in_round and not self._held:
                self._held = True
                rank_zero_info("\nSIGTERM: stopping after this validation round and saving last.ckpt")
                return
            notify(signum, frame)

        self._notify = notify
        connector._sigterm_notifier_fn = notice

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._in_round = self._trainer is trainer and not trainer.sanity_checking

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._in_round:
            return
        self._in_round = False
        if self._held and self._notify is not None:
            # Lightning's own notice (its log line, its flag): the loop stops before the next batch.
            self._held = False
            self._notify(signal.SIGTERM, None)

    def _release(self, trainer: Trainer) -> None:
        if self._trainer is trainer:
            vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
        self._trainer, self._in_round, self._held = None, False, False

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._release(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._release(trainer)

"""``StopWhenConverged``: the early-stopping rule every paper shares ("train until validation stops improving").

A run stops when its monitored validation metric has not improved by more than ``min_delta`` for ``patience``
validation rounds in a row; ``trainer.max_steps`` (or ``max_epochs``) stays the cap. It is Lightning's
``EarlyStopping`` plus two things a results table needs:

- it remembers the step of the best validation round (``best_step``), through checkpoints, so a run that is
  killed and resumed with ``--ckpt_path last`` stops where the uninterrupted run stops and reports the same
  best step;
- it respects ``trainer.min_epochs`` / ``min_steps`` the way a researcher means them: rounds before the minimum
  count towards patience, but a run is stopped only at the first round after the minimum at which it *still*
  has not improved for ``patience`` rounds. (Lightning's own ``EarlyStopping`` raises a stop flag that stays
  raised, so a run that leaves a long plateau after the flag went up is cut off at the minimum while it is
  improving; avMNIST at noise sd 1.0 sits at chance for up to 64 epochs before it learns.)
- with ``wait_for_score`` it never stops a run whose best score has not yet passed that value (above it in mode
  ``max``, below it in ``min``): a patience counted from a best that is noise at chance level cannot tell a
  plateau from convergence. (avMNIST's model with neither mechanism sat at chance for 106 epochs on one seed at
  noise sd 1.0; the rule stopped it at its 100-epoch minimum with a best of 0.122 from epoch 5.) A run that never
  passes the value trains to the cap.
- at the end of ``fit`` it writes ``stopping.json`` into the run folder: monitor, mode, patience, the best
  score and its step, the step at which training ended and whether the rule (not the cap) ended it.
  :func:`lit_icl.core.results.run_meta` copies that record into the ``meta`` of every ``test`` run of one of
  the run's checkpoints, so a table built from ``results.json`` files can say how long each model trained.

The CLI adds it with ``--early_stopping.patience N`` (see :mod:`lit_icl.cli`), monitoring the config's own
monitored metric (its ``ModelCheckpoint(monitor=...)``) unless ``--early_stopping.monitor`` names another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from lit_icl.core.errors import ConfigError
from lit_icl.core.results import STOPPING_FILE


class StopWhenConverged(EarlyStopping):
    """Stop when ``monitor`` has not improved for ``patience`` validation rounds; record where and why.

    Args:
        monitor: the logged validation metric, e.g. ``"val/acc/label_ratio=0.25"``.
        patience: validation rounds without improvement before the run stops (at least 1).
        mode: ``"max"`` for accuracies, ``"min"`` for losses.
        min_delta: the smallest change that counts as an improvement.
        wait_for_score: no stop before the best score has passed this value (e.g. 0.2 for a 10-class accuracy,
            twice chance); ``None``: no such condition.
    """

    def __init__(self, monitor: str, patience: int, mode: str = "max", min_delta: float = 0.0,
                 wait_for_score: float | None = None) -> None:
        # Checked after every validation round (not at training-epoch ends): a round is the unit of patience.
        super().__init__(monitor=monitor, patience=patience, mode=mode, min_delta=min_delta,
                         check_on_train_epoch_end=False, strict=True, check_finite=True)
        self.wait_for_score = wait_for_score
        #: Global step of the best validation round so far (``None`` before the first round).
        self.best_step: int | None = None

    def _run_early_stopping_check(self, trainer: Trainer) -> None:
        before, stopping = self.best_score.clone(), trainer.should_stop
        super()._run_early_stopping_check(trainer)
        # Lightning moves ``best_score`` to the monitored metric's device when a round improves on it, so on a GPU
        # the copy taken before the round can sit on another device than the score after it.
        if not torch.equal(before.to(self.best_score.device), self.best_score):  # this round improved
            self.best_step = int(trainer.global_step)
        if trainer.should_stop and not stopping and not (self._minimum_met(trainer) and self._score_passed()):
            # Keep counting (wait_count stays), but decide again next round: the stop flag would otherwise stay
            # up and end the run at the minimum even if it improves in between.
            trainer.should_stop = False
            self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
            self.stopping_reason_message = None
            self.stopped_epoch = 0

    @staticmethod
    def _minimum_met(trainer: Trainer) -> bool:
        """Whether a stop raised in this round would be honoured: the run has done ``trainer.min_epochs`` epochs
        (counting the one this round ends, when it validates at an epoch's end) and ``min_steps`` steps."""
        min_epochs = trainer.fit_loop.min_epochs or 0
        min_steps = trainer.fit_loop.epoch_loop.min_steps or 0
        epochs_done = trainer.current_epoch + int(trainer.is_last_batch)
        return epochs_done >= min_epochs and trainer.global_step >= min_steps

    def _score_passed(self) -> bool:
        """Whether the best score so far has passed ``wait_for_score`` (always, without one)."""
        if self.wait_for_score is None:
            return True
        best = float(self.best_score)
        return best > self.wait_for_score if self.mode == "max" else best < self.wait_for_score

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """A run this rule has already ended stops again before its first step: ``fit --ckpt_path last`` of a
        finished run does nothing, as it does for one that reached ``trainer.max_steps``.

        The checkpoint of the stopping round holds the rule's state (the stop reason included) but not Lightning's
        stop flag, so the resumed run trained one more validation round and then stopped again, replacing the
        run's ``last.ckpt`` and ``stopping.json`` with one round more. Resume with a higher
        ``--early_stopping.patience`` to go on under the rule (:meth:`load_state_dict`), or without the rule to go on
        to the cap.
        """
        super().on_train_start(trainer, pl_module)
        if self.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        # min_delta and wait_for_score are recorded so that a resume can be checked against them (resume_refusal);
        # Lightning records patience itself.
        return {**super().state_dict(), "best_step": self.best_step, "min_delta": abs(float(self.min_delta)),
                "wait_for_score": self.wait_for_score}

    def resume_refusal(self, state: dict[str, Any]) -> str | None:
        """Why this rule cannot go on from a checkpoint's ``state`` of it (``None`` when it can).

        A resumed run goes on counting the checkpoint's rounds without improvement, so it ends where an uninterrupted
        run with this rule's settings ends only if those rounds were counted as this rule counts them: the same
        ``min_delta`` and ``wait_for_score``, and a ``patience`` no lower than the checkpoint's (a lower one might
        have stopped the run rounds before the checkpoint). A higher patience is exact: the counts so far are the
        same, and a run the lower patience ended goes on. Checkpoints of older code do not record ``min_delta`` and
        ``wait_for_score``; those are then not compared.
        """
        found = []
        saved = state.get("patience")
        if isinstance(saved, int) and self.patience < saved:
            found.append(f"--early_stopping.patience {self.patience} is below the checkpoint's {saved} (a run with "
                         "the lower patience might have stopped before it; a higher one is allowed)")
        for name, now in (("min_delta", abs(float(self.min_delta))), ("wait_for_score", self.wait_for_score)):
            if name in state and state[name] != now:
                found.append(f"--early_stopping.{name} is {now!r} here but {state[name]!r} in the checkpoint")
        return "; ".join(found) or None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        refusal = self.resume_refusal(state_dict)
        if refusal is not None:  # the CLI refuses this before the run writes anything (check_resumed_rule)
            raise ConfigError(f"the checkpoint's early-stopping rounds were counted under other settings: {refusal}")
        patience = self.patience
        super().load_state_dict(state_dict)
        self.best_step = state_dict.get("best_step")
        # Lightning restores the checkpoint's patience; the run's own (equal or higher, above) is the one it goes on
        # with, and the one config.yaml and stopping.json record.
        self.patience = patience
        if self.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED and self.wait_count < self.patience:
            # Ended by a lower patience: under this one the run had not stopped, so it goes on (on_train_start).
            self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
            self.stopping_reason_message = None
            self.stopped_epoch = 0

    def record(self, trainer: Trainer) -> dict[str, Any]:
        """What ``stopping.json`` holds: the rule, the best round and where training ended."""
        best = float(self.best_score)
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "patience": self.patience,
            "min_delta": abs(float(self.min_delta)),
            "wait_for_score": self.wait_for_score,
            "best_score": best if torch.isfinite(self.best_score) else None,
            "best_step": self.best_step,
            "stopped_step": int(trainer.global_step),
            "stopped_early": self.stopping_reason != EarlyStoppingReason.NOT_STOPPED,
            "reason": self.stopping_reason_message,
            "max_steps": int(trainer.max_steps),
            "max_epochs": trainer.max_epochs,
        }

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        log_dir = trainer.log_dir
        if trainer.fast_dev_run or not trainer.is_global_zero or not log_dir:
            return
        path = Path(log_dir) / STOPPING_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.record(trainer), indent=2) + "\n")


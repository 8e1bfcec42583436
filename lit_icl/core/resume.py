"""Where in its training data a run stands, so that a run resumed from any checkpoint trains on what comes next.

A run's training data is a pure function of ``(data_seed, epoch, index)`` (:class:`~lit_icl.core.data.EpochSampler`),
so resuming at an epoch boundary is exact by construction. A checkpoint written *inside* an epoch needs two more
things:

1. **The position**, ``(epoch, batches of it trained)``, read off Lightning's loop counters when the checkpoint is
   written (:func:`training_position`). :class:`~lit_icl.core.data.ResumableLoader` saves it (Lightning's
   ``state_dict`` protocol for training loaders) and, on resume, skips those batches in its first pass over that
   epoch.
2. **An epoch that was cut short is recorded as unfinished.** When ``max_steps``, ``max_time`` or a callback stops a
   run in the middle of an epoch, Lightning still runs the epoch-end hooks and counts the epoch as *processed*
   (and, by the end of training, *completed*); checkpoints saved then (``last.ckpt``, the epoch's file) restore as
   "epoch finished", so a resumed run starts the next epoch and never trains on the rest of the cut one, which a
   run that was not stopped does. :func:`record_cut_epoch_unfinished` writes the counters of a checkpoint saved
   inside that epoch instead, which Lightning resumes batch by batch.

3. **A finished epoch's checkpoint resumes at the next epoch in step-bounded runs too.** A checkpoint written at an
   epoch's end (``on_train_epoch_end``: the epoch's file and ``last.ckpt``) counts the epoch as processed but not
   completed. With ``max_epochs`` Lightning resumes it at the next epoch. With ``max_steps`` (every config here)
   it counts itself as restarting in that epoch's end: it runs the epoch's end once more and counts it processed
   twice, and from then on passes the next epoch's number to the sampler. The resumed run then trains every epoch
   on the data of the epoch after it. :func:`finish_restored_epoch` resumes it as Lightning does under
   ``max_epochs``.

Both read Lightning's progress counters (``fit_loop.epoch_progress``, ``epoch_loop.batch_progress``), whose meaning
is fixed within the lightning 2.6 series this package pins. :class:`~lit_icl.callbacks.ResumeInsideEpoch` applies
them to every CLI run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lit_icl.core.errors import ConfigError

__all__ = ["RANKS_KEY", "check_resumed_ranks", "check_resumed_ranks_at_load", "finish_restored_epoch",
           "record_cut_epoch_unfinished", "training_position"]

#: The checkpoint key holding the number of DDP ranks (devices x nodes) a fit trained on. The data position counts
#: batches per rank, and ``batch_size`` and an epoch's items are per rank, so a run resumed on another number of
#: ranks would train on other batches than an uninterrupted run (it repeats or skips data) while its rewritten
#: ``config.yaml`` said the whole run had: :func:`check_resumed_ranks` refuses it.
RANKS_KEY = "training_ranks"


def check_resumed_ranks(ckpt_path: Any, checkpoint: Mapping[str, Any], world_size: int) -> None:
    """Refuse a fit resumed from ``checkpoint`` on another number of DDP ranks (devices x nodes), ``world_size``,
    than the run that wrote it.

    ``batch_size`` and ``train_batches_per_epoch`` are per rank and the saved data position counts batches per rank,
    so ``k`` ranks train on ``k`` times the batch of one, and on another number the rest of the run would train on
    other batches than an uninterrupted run (the generated data modules' epochs are ``k`` times as long: a resume on
    fewer ranks trains again on episodes it has seen, one on more skips some) while its rewritten ``config.yaml``
    said the whole run had, as with another ``batch_size``. A checkpoint of older code, without the record
    (:data:`RANKS_KEY`), is not checked. ``test`` and ``validate`` may use any number of ranks.

    The CLI calls it once the trainer knows its ranks, before anything is written
    (:func:`lit_icl.cli.checkpoints.check_resumed_ranks`); :func:`check_resumed_ranks_at_load` calls it for a fit
    started from Python.
    """
    trained = checkpoint.get(RANKS_KEY)
    if not isinstance(trained, int) or trained == world_size:
        return
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was trained on {trained} DDP rank{'s' * (trained != 1)} and this run has "
        f"{world_size}, which a resumed run cannot change (batch_size and the data position are per rank, so it would "
        "train on other batches while its config.yaml says the whole run did); resume with --trainer.devices x "
        f"--trainer.num_nodes = {trained}, or start a new run without --ckpt_path"
    )


def check_resumed_ranks_at_load(trainer: Any, checkpoint: Mapping[str, Any]) -> None:
    """:func:`check_resumed_ranks` where Lightning loads a checkpoint into a fit (``on_load_checkpoint`` of
    :class:`~lit_icl.core.module.ICLModule` and of :class:`~lit_icl.callbacks.ResumeInsideEpoch`), so that
    ``Trainer(...).fit(module, datamodule, ckpt_path=...)`` from Python is refused as the CLI is. Nothing is
    checked outside a fit (``load_from_checkpoint``: no trainer; ``test``, ``validate``: any number of ranks)."""
    if trainer is None or trainer.state.fn != "fit":
        return
    check_resumed_ranks(trainer.ckpt_path, checkpoint, trainer.world_size)


def training_position(trainer: Any) -> tuple[int, int]:
    """``(epoch, batches of that epoch the weights have trained on)`` of a fitting trainer, at any hook.

    Inside an epoch (a checkpoint saved at a batch's end or at a validation round) that is the running epoch and
    its trained batches. Once all of an epoch's batches are trained it is the next epoch and 0, unless the epoch
    loop returned early (fewer batches trained than an epoch has): then it is that epoch and its trained batches.
    """
    fit_loop = trainer.fit_loop
    epochs = fit_loop.epoch_progress.current
    done = int(fit_loop.epoch_loop.batch_progress.current.processed)
    epoch = int(epochs.processed)
    whole = done >= trainer.num_training_batches
    if epochs.started > epochs.processed:  # inside epoch `epoch`
        return (epoch + 1, 0) if whole else (epoch, done)
    if done and not whole:  # the epoch loop returned early: epoch `epoch - 1` is unfinished
        return epoch - 1, done
    return epoch, 0


def record_cut_epoch_unfinished(trainer: Any, checkpoint: dict[str, Any]) -> bool:
    """In a checkpoint being saved after a cut epoch, count that epoch as started but not processed.

    Setting the fit loop's *processed* (and *completed*) epoch counts back by one gives the counters Lightning
    writes for a checkpoint saved inside the epoch, after its last trained batch; Lightning resumes those at the
    next batch. Returns whether the checkpoint was changed (only a checkpoint saved after a cut epoch is).
    """
    epoch, done = training_position(trainer)
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
    if not done or progress is None or progress["current"]["processed"] != epoch + 1:
        return False
    for counts in (progress["total"], progress["current"]):
        counts["processed"] -= 1
        counts["completed"] = min(counts["completed"], counts["processed"])
    return True


def finish_restored_epoch(trainer: Any) -> bool:
    """Resume a run restored from a finished epoch's checkpoint at the next epoch, before its first batch.

    Call it when training starts (``on_train_start``: after Lightning has read the checkpoint's counters and
    decided how to restart, before the first epoch begins). When Lightning restarts "on the epoch's end", which it
    does only in step-bounded training, this counts the epoch completed and ends the restart, as Lightning does for
    the same checkpoint under ``max_epochs``. The next epoch then starts with its own number, whole batch counters
    and the epoch-end learning-rate step, as in a run that never stopped. Returns whether it changed anything.
    """
    from lightning.pytorch.loops.loop import _Loop

    fit_loop = trainer.fit_loop
    if not fit_loop.restarted_on_epoch_end:
        return False
    for counts in (fit_loop.epoch_progress.current, fit_loop.epoch_progress.total):
        counts.completed = counts.processed
    fit_loop.reset_restart_stage()
    fit_loop.epoch_loop.reset_restart_stage()
    # The fit loop's own setter keeps step-bounded runs restarting; the base setter clears it and its children's.
    _Loop.restarting.fset(fit_loop, False)
    return True

"""``ResumeInsideEpoch``: a run stopped inside an epoch resumes where it stopped, not at the next epoch.

Lightning's ``max_time`` and ``max_steps`` (and any callback that sets ``trainer.should_stop``) end a run in the
middle of an epoch, and the checkpoints it then saves, ``last.ckpt`` among them, count that epoch as done. A run
resumed from them with ``--ckpt_path last`` starts the next epoch: it never trains on the rest of the cut one, and
it ends with other weights than a run that was not stopped. This callback, which the CLI adds to every run:

- writes such checkpoints with the epoch counted as unfinished (:func:`lit_icl.core.resume.record_cut_epoch_unfinished`),
  which Lightning resumes at the next batch, when the training loader can resume inside an epoch
  (:class:`lit_icl.core.data.ResumableLoader`: every paper's; avMNIST's module also carries each rank's dropout
  RNG state in its checkpoints, and I2CL draws each step's noise from a seed of its own); other runs keep
  Lightning's rule;
- records the number of DDP ranks the fit trains on (:data:`lit_icl.core.resume.RANKS_KEY`), which a resume
  must keep: the position and the data of an epoch are counted per rank (a resume on another number is refused
  where the checkpoint is loaded, :func:`lit_icl.core.resume.check_resumed_ranks_at_load`);
- resumes a checkpoint written at an epoch's end at the next epoch, which Lightning gets wrong in runs bounded by
  ``max_steps`` (:func:`lit_icl.core.resume.finish_restored_epoch`);
- hands the training loader its saved data position (:class:`lit_icl.core.data.ResumableLoader`) where Lightning
  itself does not: Lightning loads it only when it makes the training loader after restoring the checkpoint (a
  module whose ``configure_optimizers`` reads ``trainer.estimated_stepping_batches``, as IC-SSL's and I2CL's
  schedules do, makes it before) and only when it restarts inside an epoch. Without it, a resumed run with
  DataLoader workers could train its first epoch on the items its workers were handed before the restore.

So a run trained in sittings of ``--trainer.max_time`` (each resumed with ``--ckpt_path last``) ends bit-identical
to one run of the same length (``tests/core/test_data.py``, ``tests/coqe/omniglot/test_cli.py`` and, under DDP,
``tests/icssl/test_cli.py``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from lit_icl.core.data import ResumableLoader
from lit_icl.core.resume import (
    RANKS_KEY,
    check_resumed_ranks_at_load,
    finish_restored_epoch,
    record_cut_epoch_unfinished,
)


def resumes_inside_epoch(trainer: Trainer) -> bool:
    """Whether a checkpoint of ``trainer``'s fit written inside an epoch resumes exactly: its training loaders can
    resume inside an epoch (:class:`~lit_icl.core.data.ResumableLoader`)."""
    loader = trainer.fit_loop._combined_loader
    return (trainer.state.fn == "fit" and loader is not None
            and all(isinstance(dl, ResumableLoader) for dl in loader.flattened))


class ResumeInsideEpoch(Callback):
    """Checkpoints saved after a cut epoch record it as unfinished; a resumed loader gets its data position."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == "fit":  # the position is in batches per rank: a resume needs as many ranks
            checkpoint[RANKS_KEY] = trainer.world_size
        if resumes_inside_epoch(trainer):
            record_cut_epoch_unfinished(trainer, checkpoint)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # The record is refused on other ranks by every ICLModule; this covers other modules run with the callback.
        check_resumed_ranks_at_load(trainer, checkpoint)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        finish_restored_epoch(trainer)  # a finished epoch's checkpoint resumes at the next epoch (max_steps runs)
        # Saved loader states that Lightning restored but did not hand over wait here: when it made the training
        # loader before restoring the checkpoint, and when it resumes at an epoch's end (it then does not count
        # itself as restarting). The first batch is drawn after this hook, so loading them now takes effect.
        fit_loop = trainer.fit_loop
        states, fit_loop._combined_loader_states_to_load = fit_loop._combined_loader_states_to_load, []
        if states and fit_loop._combined_loader is not None:
            fit_loop._combined_loader._load_state_dicts(states)

"""``AgreeOnSigterm``: under DDP, every rank stops at the same step on SIGTERM, and no step waits for the GPU for it.

Lightning 2.6 makes DDP ranks agree on SIGTERM (a cluster's preemption or ``scancel``) at the start of every training
batch: rank 0 builds a one-element tensor on the training device and broadcasts it, and every rank reads it back
(``_TrainingEpochLoop._broadcast_sigterm_tensor``). On a GPU that is two waits for the device per step (the blocking
copy of the flag to the GPU and ``.item()``), so the host can no longer queue a step while the GPU runs the last
one: each step costs its host time plus its GPU time, which for this project's small nets under CUDA graphs is most
of a step (Lightning issue #21487 shows the wait in a profile). The signal handler also joins the broadcast from
inside the handler, which pairs with whatever broadcast the other ranks happen to be in. On 2 gloo ranks on the CPU,
with Lightning 2.6.6, a SIGTERM delivered to either rank ended the run with the other rank failing in a collective
("Connection closed by peer"), and the run exited 1 when it was rank 1 that received it.

This callback, which the CLI adds to every run (it does nothing outside multi-process training), replaces both
parts for ``fit``:

- the signal handler only records that this rank was asked to stop (and, as Lightning's does, passes the signal on
  to the ranks it launched); it joins no collective;
- at the start of each training batch the ranks all-reduce (max) their flags, as host tensors over a gloo group of
  their own (:class:`SigtermVote`). The reduction started at one batch is read at the next, by which time it has
  long finished, so the host waits neither for the device nor, in practice, for the other ranks. When the verdict
  is to stop, every rank raises Lightning's ``SIGTERMException`` before the same batch: the run ends as Lightning
  ends it (no new checkpoint; resume from the last one), on all ranks at once, whichever rank got the signal.

A signal is acted on at most two training batches after it arrives; one that arrives during a validation round is
acted on after the round (Lightning would stop inside it on the rank that got the signal, while the others wait in
the round's metric reductions). A single-process run keeps Lightning's own handling.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_prefixed_message
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

__all__ = ["AgreeOnSigterm", "SigtermVote"]

# Under Lightning's logger, which the CLI prints at INFO: the same place as Lightning's own "Received SIGTERM".
log = logging.getLogger("lightning.pytorch.callbacks.sigterm")


class SigtermVote:
    """Whether any rank has been asked to stop, agreed by all ranks without waiting for a device.

    Each :meth:`poll` hands in this rank's flag and returns the verdict of the previous poll: the maximum of the
    flags over the ranks of ``group`` (a gloo group, so the flags are host tensors), all-reduced in the background
    between the two polls. Every rank polls once per training batch, so every rank gets the same verdict at the same
    batch. After a verdict to stop no reduction is started.

    Args:
        group: the process group to vote in (gloo; host tensors only).
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work: Any = None

    def poll(self, stop_here: bool) -> bool:
        """``True`` when some rank had asked to stop by its previous poll; otherwise start this poll's vote."""
        if self._work is not None:
            self._work.wait()
            self._work = None
            if int(self._flag[0]):
                return True
        # A fresh tensor per vote: the one being reduced is never written while the reduction may read it.
        self._flag = torch.tensor([int(stop_here)], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return False

    def close(self) -> None:
        """Finish the vote in flight (every rank has started it, so it completes)."""
        if self._work is not None:
            self._work.wait()
            self._work = None


class AgreeOnSigterm(Callback):
    """Replace Lightning's per-batch SIGTERM broadcast under DDP by a :class:`SigtermVote` (see the module doc)."""

    def __init__(self) -> None:
        self._vote: SigtermVote | None = None
        self._group: Any = None
        self._asked = False
        self._trainer: Trainer | None = None

    @staticmethod
    def applies(trainer: Trainer, stage: str) -> bool:
        """Whether ``trainer`` runs Lightning's per-batch broadcast that this callback replaces: a multi-process
        ``fit``, on a Lightning whose training loop has it."""
        return (
            stage == "fit"
            and trainer.world_size > 1
            and dist.is_available()
            and dist.is_initialized()
            and hasattr(trainer.fit_loop.epoch_loop, "_broadcast_sigterm_tensor")
            and hasattr(trainer._signal_connector, "_sigterm_notifier_fn")
        )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning registers its signal handlers after the setup hooks, so the handler set here is the one it
        # registers. Every rank runs this hook at the same point, as new_group requires.
        if not self.applies(trainer, stage):
            return
        self._trainer = trainer
        self._asked = False
        self._group = dist.new_group(backend="gloo")
        self._vote = SigtermVote(self._group)
        # Instance attributes: they shadow Lightning's methods for this trainer only.
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = self._agree
        trainer._signal_connector._sigterm_notifier_fn = self._notice

    def _notice(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM handler: note the request and pass the signal on to the ranks this process launched."""
        trainer = self._trainer
        assert trainer is not None
        log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", trainer.local_rank))
        if not self._asked:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        self._asked = True

    def _agree(self) -> None:
        """Called by Lightning's training loop before each batch (in place of its broadcast)."""
        trainer = self._trainer
        assert trainer is not None and self._vote is not None
        if self._vote.poll(self._asked):
            rank_zero_info(f"SIGTERM received: all {trainer.world_size} ranks stop after step {trainer.global_step}")
            trainer._signal_connector.received_sigterm = True
            raise SIGTERMException()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._vote is not None:
            self._vote.close()
            # Every rank tears down, so every rank leaves the group (a process may fit again and make a new one).
            dist.destroy_process_group(self._group)
        self._release(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A vote may be in flight that another rank, stopped by the same failure, never joins: do not wait for it.
        self._release(trainer)

    def _release(self, trainer: Trainer) -> None:
        if self._vote is None:
            return
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)
        vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
        self._vote = None
        self._group = None
        self._trainer = None

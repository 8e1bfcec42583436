"""``StopTogether``: DDP ranks agree to stop (SIGTERM, ``max_time``) on the host, without a wait for the GPU per step.

Lightning 2.6 makes DDP ranks agree on two things at every training batch, each time through a collective on the
training device that the host then reads back:

- **SIGTERM** (a cluster's preemption, ``scancel``): before every batch rank 0 builds a one-element tensor on the
  training device, broadcasts it, and every rank reads it (``_TrainingEpochLoop._broadcast_sigterm_tensor``). On a
  GPU that is two waits for the device (the flag's blocking copy and ``.item()``; Lightning issue #21487 shows
  them in a profile). The signal handler joins a broadcast too, from inside the handler, which pairs with whatever
  broadcast the other ranks happen to be in: on 2 gloo ranks with Lightning 2.6.6, a SIGTERM to either rank often
  ended the run with the other failing in a collective ("Connection closed by peer";
  ``experiments/results/ddp_stop_cpu.md``).
- **``max_time``**: after every batch Lightning's ``Timer`` broadcasts rank 0's "time is up" as a pickled object
  (``broadcast_object_list``), which on NCCL goes through the GPU and back.

A wait for the device at every step means the host can no longer queue a step while the GPU runs the previous
one, so each step costs its host time plus its GPU time: for this project's small nets under CUDA graphs, most of
a step. This callback, which the CLI adds to every run (it does nothing outside multi-process training), replaces
both for ``fit``:

- the SIGTERM handler only records the signal (and, as Lightning's does, passes it on to the ranks this process
  launched); the ``Timer``'s per-batch check only records whether this rank's time is up. Neither joins a
  collective;
- before each training batch the ranks all-reduce (max) both flags, as host tensors over a gloo group of their
  own (:class:`StopVote`). The reduction started at one batch is read at the next, by which time it has long
  finished, so the host waits neither for the device nor, in practice, for the other ranks. Every rank reads the
  same verdict before the same batch: on SIGTERM each raises Lightning's ``SIGTERMException`` (the run then ends
  as a single process does on SIGTERM: :class:`~lit_icl.callbacks.RunCheckpoint` writes ``last.ckpt`` at that
  step and the command exits with status 143); when the time is up each sets
  ``trainer.should_stop``, and the run ends after that batch as ``max_time`` ends it (validation, checkpoints and
  an exact resume with ``--ckpt_path last``).

Either is acted on at most two training batches after it happens (one that happens during a validation round,
after the round: Lightning would stop inside it on the rank that got the signal, while the others wait in the
round's metric reductions). The ``Timer``'s checks at the start of ``fit`` and at epoch ends (``interval="epoch"``)
stay Lightning's: once per fit or epoch. A single-process run keeps Lightning's own handling, which has no
collective.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_prefixed_message
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_icl.core.ranks import host_group, release_host_group

__all__ = ["StopTogether", "StopVote"]

# Under Lightning's logger, which the CLI prints at INFO: the same place as Lightning's own "Received SIGTERM".
log = logging.getLogger("lightning.pytorch.callbacks.ddp_stop")

#: The reasons to stop, in the order of a vote's flags.
SIGTERM, TIME_UP = 0, 1


class StopVote:
    """Flags that any rank has raised, agreed by all ranks without waiting for a device.

    Each :meth:`poll` hands in this rank's flags and returns the verdict of the previous poll: each flag's maximum
    over the ranks of ``group`` (a gloo group, so the flags are host tensors), all-reduced in the background between
    the two polls. When every rank polls once per training batch, every rank gets the same verdict before the same
    batch.

    Args:
        group: the process group to vote in (gloo; host tensors only).
        flags: how many flags a poll carries.
    """

    def __init__(self, group: Any, flags: int = 2) -> None:
        self.group = group
        self.flags = flags
        self._votes = torch.zeros(flags, dtype=torch.int32)
        self._work: Any = None

    def poll(self, *raised: bool) -> tuple[bool, ...]:
        """The flags raised anywhere by the previous poll (all ``False`` at the first); starts this poll's vote."""
        if len(raised) != self.flags:
            raise ValueError(f"StopVote.poll takes {self.flags} flags, got {len(raised)}")
        verdict = (False,) * self.flags
        if self._work is not None:
            self._work.wait()
            verdict = tuple(bool(v) for v in self._votes.tolist())  # a host tensor: no device to wait for
        # A fresh tensor per vote: the one being reduced is never written while the reduction may read it.
        self._votes = torch.tensor([int(r) for r in raised], dtype=torch.int32)
        self._work = dist.all_reduce(self._votes, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return verdict

    def close(self) -> None:
        """Finish the vote in flight (every rank has started it, so it completes)."""
        if self._work is not None:
            self._work.wait()
            self._work = None


class StopTogether(Callback):
    """Replace Lightning's per-batch SIGTERM broadcast and ``Timer`` broadcast under DDP by a :class:`StopVote`
    (see the module doc)."""

    def __init__(self) -> None:
        self._vote: StopVote | None = None
        self._group: Any = None
        self._raised = [False, False]
        self._asked_by = "SIGTERM"
        self._trainer: Trainer | None = None
        self._timers: list[Timer] = []

    @staticmethod
    def replaces_lightnings(trainer: Trainer) -> bool:
        """Whether ``trainer``'s Lightning has the per-batch broadcast and the signal handler this callback
        replaces (Lightning 2.6)."""
        return (hasattr(trainer.fit_loop.epoch_loop, "_broadcast_sigterm_tensor")
                and hasattr(trainer._signal_connector, "_sigterm_notifier_fn"))

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning registers its signal handlers after the setup hooks, so the handler set here is the one it
        # registers. Every rank runs this hook at the same point, as making a group requires.
        if not self.replaces_lightnings(trainer):
            return
        self._group = host_group(trainer, stage)
        if self._group is None:  # not a multi-process fit: Lightning's handling has no collective
            return
        self._trainer = trainer
        self._raised = [False, False]
        self._asked_by = "SIGTERM"  # or Ctrl-C; when only another rank was asked, SIGTERM's name stands for it
        self._vote = StopVote(self._group, flags=2)
        # Instance attributes: they shadow Lightning's methods for this trainer only.
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = self._agree
        trainer._signal_connector._sigterm_notifier_fn = self._notice
        self._timers = [cb for cb in trainer.callbacks if isinstance(cb, Timer) and cb._interval == "step"]
        for timer in self._timers:
            timer.on_train_batch_end = self._timer_check(timer)

    def _notice(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM handler: note the request and pass the signal on to the ranks this process launched."""
        trainer = self._trainer
        assert trainer is not None
        log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", trainer.local_rank))
        if not self._raised[SIGTERM]:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        self._raised[SIGTERM] = True

    @property
    def voting(self) -> bool:
        """Whether this fit's ranks vote on stopping (a multi-process fit, between its setup and its end)."""
        return self._vote is not None

    def request_stop(self) -> None:
        """Ask every rank to stop before the next training batch but one, as SIGTERM does (the CLI's Ctrl-C,
        :class:`~lit_icl.callbacks.StopOnCtrlC`)."""
        self._raised[SIGTERM] = True
        self._asked_by = "Ctrl-C"

    def _timer_check(self, timer: Timer) -> Any:
        """A ``Timer``'s per-batch check that records this rank's verdict for the next vote instead of
        broadcasting rank 0's."""

        def on_train_batch_end(trainer: Trainer, *args: Any, **kwargs: Any) -> None:
            if timer._duration is not None and timer.time_elapsed() >= timer._duration:
                self._raised[TIME_UP] = True

        return on_train_batch_end

    def _agree(self) -> None:
        """Called by Lightning's training loop before each batch (in place of its broadcast)."""
        trainer = self._trainer
        assert trainer is not None and self._vote is not None
        sigterm, time_up = self._vote.poll(*self._raised)
        if sigterm:
            rank_zero_info(f"{self._asked_by} received: all {trainer.world_size} ranks stop after step "
                           f"{trainer.global_step}")
            trainer._signal_connector.received_sigterm = True
            raise SIGTERMException()
        if time_up and not trainer.should_stop:
            rank_zero_info(f"Time limit reached: all {trainer.world_size} ranks stop after step "
                           f"{trainer.global_step + 1}")
            trainer.should_stop = True

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._vote is not None:
            self._vote.close()
            release_host_group(self._group)
        self._release(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A vote may be in flight that another rank, stopped by the same failure, never joins: do not wait for it.
        self._release(trainer)

    def _release(self, trainer: Trainer) -> None:
        if self._vote is None:
            return
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)
        vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
        for timer in self._timers:
            vars(timer).pop("on_train_batch_end", None)
        self._timers = []
        self._vote = None
        self._group = None
        self._trainer = None

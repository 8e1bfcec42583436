"""``FiniteGuard``: stop a run whose training loss or weights stop being finite, before a checkpoint is saved.

A learning rate that is too large, a NaN in the data, or a degenerate configuration makes the loss ``nan`` or
``inf``; from that step on every weight the optimizer touches is NaN, and Lightning would go on to save
``last.ckpt`` (and the epoch's checkpoint) full of NaN, which a later ``--ckpt_path last`` then resumes. The
CLI adds this callback to every run (as it adds :class:`lit_icl.core.results.ResultsWriter`), so such a run
stops with one line ``lit_icl: error: training loss is nan at step N ...`` and no checkpoint written after it.

Two checks:

- the loss, in ``on_before_backward`` (before the step's gradients reach the weights). On a CPU it is read at
  once; on an accelerator it stays on the device and is read every ``sync_every`` batches (by default on the
  logging steps, when Lightning reads the logged values back anyway), at epoch end and before every checkpoint,
  so a fast GPU run is not made to wait for the device by the guard;
- the trainable parameters, before every checkpoint (``on_save_checkpoint``, and at the end of each training
  epoch and validation, which come before :class:`~lightning.pytorch.callbacks.ModelCheckpoint` saves because
  Lightning runs checkpoint callbacks last): a non-finite gradient with a finite loss is caught there.

Under DDP the ranks agree before any of them stops: at each check they all-reduce whether a rank found a
non-finite value (host flags over a gloo group of the guard's own, at points every rank reaches together), and
all raise, naming the rank. Without that, the rank that found it stopped alone and the others waited in the step's
gradient reduction: a gloo rank failed with "Connection closed by peer", an NCCL one until the collective timeout.

Neither check changes a number, so runs stay bit-for-bit reproducible; the callback holds no state worth saving.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer

from lit_icl.core.errors import TrainingDiverged
from lit_icl.core.ranks import host_group, release_host_group


class FiniteGuard(Callback):
    """Raise :class:`~lit_icl.core.errors.TrainingDiverged` on a non-finite training loss or weight.

    Args:
        sync_every: on an accelerator, how many training batches may pass between reads of the recorded loss
            check (each read waits for the device); ``None`` (default): the trainer's ``log_every_n_steps``, so
            the reads fall on the steps whose logging waits for the device anyway. A CPU run is checked every
            batch at no cost.
    """

    def __init__(self, sync_every: int | None = None) -> None:
        if sync_every is not None and (isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1):
            raise ValueError(f"sync_every={sync_every!r} must be an integer >= 1 or None")
        self.sync_every = sync_every
        self._batch = (0, 0)  # (epoch, batch index) of the batch being trained
        # Losses on an accelerator not read yet: (step, epoch, batch) on the host, the loss on the device.
        self._pending: list[tuple[int, int, int]] = []
        self._pending_losses: list[torch.Tensor] = []
        self._group: Any = None  # under DDP: the gloo group the ranks agree in
        self._rank = 0

    # ------------------------------------------------------------------ DDP
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Every rank runs this hook at the same point, as making a group requires.
        self._group = host_group(trainer, stage)
        self._rank = int(trainer.global_rank)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        release_host_group(self._group)
        self._group = None

    def _first_bad_rank(self, bad: bool) -> int | None:
        """The lowest rank whose check found a non-finite value (this one's verdict alone without DDP), or
        ``None``. Every rank calls it at the same checks, so the reduction pairs up."""
        if self._group is None:
            return self._rank if bad else None
        # min over ranks of (rank if bad else world size): the host flags of a gloo group, no device involved.
        world = dist.get_world_size(self._group)
        flag = torch.tensor([self._rank if bad else world], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        first = int(flag[0])
        return None if first == world else first

    @staticmethod
    def _raise_for_rank(rank: int, when: str, step: int, epoch: int, batch: int) -> None:
        """What a rank raises when another rank's loss check failed (``when``: "at" or "by" the step)."""
        raise TrainingDiverged(
            f"the training loss was not finite on rank {rank} {when} step {step} (epoch {epoch}, batch {batch}); "
            "every rank stopped before saving a checkpoint with non-finite weights; lower the learning rate "
            "(--model.init_args.lr) or check the data and config for non-finite values"
        )

    # ------------------------------------------------------------------ the loss
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._batch = (int(trainer.current_epoch), int(batch_idx))

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor):
            return
        loss = loss.detach().float().sum()
        if not self._defers(loss.device):
            value = float(loss)
            bad = self._first_bad_rank(not math.isfinite(value))
            if bad == self._rank:
                self._raise_loss(trainer.global_step, *self._batch, value)
            if bad is not None:
                self._raise_for_rank(bad, "at", trainer.global_step, *self._batch)
            return
        # On an accelerator: keep the loss where it is (no copy, no wait) until the next read.
        self._pending.append((int(trainer.global_step), *self._batch))
        self._pending_losses.append(loss)

    @staticmethod
    def _defers(device: torch.device) -> bool:
        """Whether a loss on ``device`` is read later: reading it at once costs a CPU nothing, a GPU a wait."""
        return device.type != "cpu"

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every = self.sync_every or max(int(trainer.log_every_n_steps), 1)
        if len(self._pending) >= every:
            self._check_pending_losses()

    def _check_pending_losses(self) -> None:
        """Read the losses kept on the device (one transfer) and raise at the first non-finite one."""
        if not self._pending:
            return
        values = torch.stack(self._pending_losses).cpu().tolist()
        where = self._pending
        self._pending, self._pending_losses = [], []
        found = next(((at, value) for at, value in zip(where, values) if not math.isfinite(value)), None)
        bad = self._first_bad_rank(found is not None)
        if bad == self._rank:
            self._raise_loss(*found[0], found[1])
        if bad is not None:
            self._raise_for_rank(bad, "by", *where[-1])

    @staticmethod
    def _raise_loss(step: int, epoch: int, batch: int, value: float) -> None:
        raise TrainingDiverged(
            f"training loss is {value} at step {step} (epoch {epoch}, batch {batch}); the run stopped before "
            "saving a checkpoint with non-finite weights; lower the learning rate (--model.init_args.lr) or check "
            "the data and config for non-finite values"
        )

    # ------------------------------------------------------------------ the weights, before any checkpoint
    def check_weights(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Raise if the recorded loss or any trainable parameter is non-finite (called before checkpoints)."""
        self._check_pending_losses()
        params = [(name, p) for name, p in pl_module.named_parameters() if p.requires_grad]
        if not params:
            return
        with torch.no_grad():  # one device-to-host read for all parameters
            finite = torch.stack([torch.isfinite(p).all().to(params[0][1].device) for _, p in params]).cpu().tolist()
        bad = [name for (name, _), ok in zip(params, finite) if not ok]
        first = self._first_bad_rank(bool(bad))
        if first is not None and first != self._rank:
            raise TrainingDiverged(
                f"weights became non-finite on rank {first} by step {trainer.global_step}; every rank stopped before "
                "saving them; lower the learning rate (--model.init_args.lr) or check the data for non-finite values"
            )
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise TrainingDiverged(
                f"weights became non-finite by step {trainer.global_step} ({shown}); the run stopped before saving "
                "them; lower the learning rate (--model.init_args.lr) or check the data for non-finite values"
            )

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.check_weights(trainer, pl_module)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.check_weights(trainer, pl_module)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == "fit":
            self.check_weights(trainer, pl_module)

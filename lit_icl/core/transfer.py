"""Host-to-device copies that leave the host free: from pinned (page-locked) memory on a CUDA device.

A GPU step is fast when the host queues its work and moves on. A copy to the GPU from ordinary (pageable) host
memory may make the host wait: CUDA stages pageable memory through buffers of its own and "might be synchronous
with respect to host" (CUDA runtime API, *API synchronization behavior*), and then the step's copy waits behind
every kernel queued before it. A copy from pinned memory with ``non_blocking=True`` is queued like a kernel and
returns at once; PyTorch keeps the pinned block from being reused until the copy has run.

So on CUDA the project's loaders pin their batches (``DataLoader(pin_memory=True)``; with workers a thread of the
DataLoader does it), and tensors made on the host inside a step (CoQE's logit noise, I2CL's token ids) go through
:func:`to_device`. Pinning copies values, it never changes them, so a run's numbers are the same either way; on a
CPU nothing is pinned or copied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["pins_memory", "to_device"]


def pins_memory(datamodule: Any) -> bool:
    """Whether ``datamodule``'s loaders should pin their batches: its trainer trains on a CUDA device.

    Read when a loader is made (``train_dataloader()`` and the like), which Lightning does after it has attached
    the trainer; outside a trainer (a script iterating a loader itself) nothing is pinned.
    """
    trainer = getattr(datamodule, "trainer", None)
    if trainer is None:
        return False
    return trainer.strategy.root_device.type == "cuda"


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """``tensor`` on ``device`` without making the host wait for the device's queue.

    A host tensor bound for a CUDA device is copied into pinned memory and sent from there with
    ``non_blocking=True`` (a tensor that is already pinned is sent as it is: do not write to it until the device has
    read it). Any other move is an ordinary ``Tensor.to``, which returns ``tensor`` itself when it is already on
    ``device``.
    """
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)

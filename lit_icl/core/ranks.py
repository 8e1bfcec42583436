"""A process group for DDP ranks to agree on the host, without waiting for a device.

Lightning's own agreements between ranks (and a reduction on the default group under NCCL) go through the GPU,
and reading their result makes the host wait for every kernel queued before it. Decisions that are made on the
host anyway (stop on SIGTERM, stop at ``max_time``, stop on a non-finite loss) are agreed instead over a gloo group
of host tensors: :func:`host_group` makes one for a multi-process ``fit``, :func:`release_host_group` ends it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["host_group", "release_host_group"]


def host_group(trainer: Any, stage: str) -> Any | None:
    """A gloo group of all ranks for a multi-process ``fit``; ``None`` otherwise (one process, or another stage).

    Making a group is collective: call it on every rank at the same point (a callback's ``setup``).
    """
    if stage != "fit" or trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.new_group(backend="gloo")


def release_host_group(group: Any | None) -> None:
    """End a group made by :func:`host_group` (a process may fit again and make a new one); ``None`` is a no-op."""
    if group is not None:
        dist.destroy_process_group(group)

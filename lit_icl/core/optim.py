"""Optimizer settings every paper shares."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def fused_if_cuda(params: Iterable[torch.Tensor]) -> dict[str, bool]:
    """``{"fused": True}`` for ``torch.optim.Adam`` / ``AdamW`` when every parameter is on a CUDA device, else ``{}``.

    The fused kernel updates all parameters in a few launches instead of torch's default multi-tensor loop
    (a dozen launches per parameter group and state); on our small nets the update is otherwise a large part of
    a GPU step's launches. It is deterministic. On a CPU nothing changes: CPU runs keep torch's default update and
    so their numbers.
    """
    params = list(params)
    if params and all(p.device.type == "cuda" for p in params):
        return {"fused": True}
    return {}

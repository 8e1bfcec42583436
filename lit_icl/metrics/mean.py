"""``SyncFreeMean``: torchmetrics' ``MeanMetric`` without reading the device back on every update."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import MeanMetric


class SyncFreeMean(MeanMetric):
    """A running (weighted) mean that leaves NaN values out, like ``MeanMetric``, without a device sync.

    ``MeanMetric`` (its default ``nan_strategy="warn"``) asks ``bool(isnan(x).any())`` on every ``update``, to drop
    NaN values by boolean indexing: on a GPU each update waits for the device (IC-SSL's validation made 112 such
    waits a round). Here a NaN value, or a NaN weight, gets weight 0 instead, which leaves it out of the mean just
    the same, with nothing read back (and no warning). Without NaNs the state changes by the very same operations
    as ``MeanMetric``'s, so the values are bit-identical (``tests/metrics/test_mean.py``).
    """

    def _cast_and_nan_check_input(self, x: float | Tensor, weight: float | Tensor | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(x, Tensor):
            x = torch.as_tensor(x, dtype=self.dtype, device=self.device)
        if weight is None:
            weight = torch.ones_like(x)
        elif not isinstance(weight, Tensor):
            weight = torch.as_tensor(weight, dtype=self.dtype, device=self.device)
        nans = torch.isnan(x) | torch.isnan(weight)
        return torch.where(nans, 0, x).to(self.dtype), torch.where(nans, 0, weight).to(self.dtype)

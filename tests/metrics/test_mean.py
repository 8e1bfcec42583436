"""``SyncFreeMean``: ``MeanMetric``'s values, bit for bit, with NaN values left out, and no read-back per update."""

from __future__ import annotations

import warnings

import pytest
import torch
from torchmetrics import MeanMetric

from lit_icl.metrics.mean import SyncFreeMean


def _feed(metric, batches):
    for value, weight in batches:
        metric.update(value) if weight is None else metric.update(value, weight)
    return metric


def test_without_nans_the_states_and_the_mean_are_bit_identical_to_mean_metric() -> None:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(37, generator=g), None), (torch.randn(5, 3, generator=g), torch.rand(5, 3, generator=g)),
               (0.25, None), (torch.tensor(2.0), 3.0)]
    ours, theirs = _feed(SyncFreeMean(), batches), _feed(MeanMetric(), batches)
    assert torch.equal(ours.mean_value, theirs.mean_value) and torch.equal(ours.weight, theirs.weight)
    assert torch.equal(ours.compute(), theirs.compute())


def test_nan_values_and_nan_weights_are_left_out_of_the_mean() -> None:
    metric = SyncFreeMean()
    metric.update(torch.tensor([1.0, float("nan"), 3.0]))
    metric.update(torch.tensor([10.0, 5.0]), torch.tensor([float("nan"), 1.0]))
    assert metric.compute().item() == pytest.approx((1.0 + 3.0 + 5.0) / 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MeanMetric warns that it removed NaN values
        reference = _feed(MeanMetric(), [(torch.tensor([1.0, float("nan"), 3.0]), None),
                                         (torch.tensor([10.0, 5.0]), torch.tensor([float("nan"), 1.0]))])
    assert metric.compute().item() == pytest.approx(reference.compute().item())


def test_an_update_reads_nothing_back_from_the_tensors(monkeypatch) -> None:
    """``bool(tensor)`` and ``item()`` are what wait for a GPU; ``MeanMetric`` calls one, ``SyncFreeMean`` none."""
    def refuse(*args, **kwargs):
        raise AssertionError("read a tensor back to the host")

    ours, theirs = SyncFreeMean(), MeanMetric()
    values = torch.tensor([0.5, float("nan"), 1.5])
    monkeypatch.setattr(torch.Tensor, "__bool__", refuse)
    monkeypatch.setattr(torch.Tensor, "item", refuse)
    ours.update(values)
    with pytest.raises(AssertionError, match="read a tensor back"):
        theirs.update(values)
    monkeypatch.undo()
    assert ours.compute().item() == pytest.approx(1.0)

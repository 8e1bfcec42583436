"""A CoQE module is called the way its net is (``model(images, labels)`` in a notebook), with the net's answer."""

from __future__ import annotations

import torch

from lit_icl.coqe import CoQEClassificationModule, CoQEClassifier, CoQERegressionModule, CoQERegressor


def test_a_classification_module_answers_with_its_nets_logits() -> None:
    torch.manual_seed(0)
    model = CoQEClassificationModule(CoQEClassifier(12, resnet_channels=(8, 8, 8, 16), depth=1)).eval()
    images, labels = torch.rand(2, 5, 16, 16), torch.randint(0, 12, (2, 4))
    with torch.no_grad():
        ours, nets = model(images, labels), model.net(images, labels)
    assert all(torch.equal(a, b) for a, b in zip(ours, nets) if a is not None)


def test_a_regression_module_answers_with_its_nets_predictions() -> None:
    torch.manual_seed(0)
    model = CoQERegressionModule(CoQERegressor(4, width=16, depth=1, heads=2, max_points=8)).eval()
    xs, ys, xq = torch.randn(3, 6, 4), torch.randn(3, 6), torch.randn(3, 6, 4)
    with torch.no_grad():
        assert torch.equal(model(xs, ys), model.net(xs, ys))
        assert torch.equal(model(xs, ys, xq), model.net(xs, ys, xq))

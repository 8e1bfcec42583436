"""``lit_icl.core.module``: the training objective every "net, then a loss" module compiles as its step."""

from __future__ import annotations

import pickle
import sys
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.module import ICLModule, TrainingObjective, objective_class


class _Squared(ICLModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 2)

    @staticmethod
    def training_loss(out: Tensor, y: Tensor) -> Tensor:
        return F.mse_loss(out, y)


class _Absolute(ICLModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

    @staticmethod
    def training_loss(out: Tensor, y: Tensor) -> Tensor:
        return F.l1_loss(out, y)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_each_module_class_compiles_its_objective_as_a_code_object_of_its_own(fresh_dynamo) -> None:
    """Dynamo compiles one code object at most ``recompile_limit`` times per process: with a limit of 1, the
    objectives of two papers' modules (other nets, other losses) both compile whole, which one shared ``forward``
    could not (the second would be a recompilation, refused under ``fullgraph``)."""
    # torch's own config.patch, not monkeypatch (why: tests/conftest.py, _TORCH_CONFIGS).
    with torch._dynamo.config.patch(recompile_limit=1):
        x, y = torch.randn(5, 3), torch.randn(5, 2)
        for module_class in (_Squared, _Absolute):
            module = module_class()
            objective = module.training_objective
            assert isinstance(objective, TrainingObjective) and type(objective) is objective_class(module_class)
            expected, out = objective((x,), (y,))
            objective.compile(backend="eager", fullgraph=True)
            loss, _ = objective((x,), (y,))
            assert torch.equal(loss, expected) and torch.equal(expected, module_class.training_loss(out, y))
    assert objective_class(_Squared).forward.__code__ is not objective_class(_Absolute).forward.__code__
    if sys.version_info >= (3, 11):  # named after the module class in tracebacks and profiles
        assert objective_class(_Squared).forward.__code__.co_qualname == "_Squared.training_objective"
    assert objective_class(_Squared) is objective_class(_Squared)  # one class, and one code object, per module class


def test_a_module_pickles_without_its_objective_and_makes_it_again_for_its_own_net() -> None:
    """The objective's class is made at run time, so pickle could not find it by name; it is a cache, left out
    of the pickled state and made again on use, around the unpickled module's net."""
    module = _Squared()
    assert module.training_objective.net is module.net
    copy = pickle.loads(pickle.dumps(module))
    assert "_training_objective" not in copy.__dict__
    assert copy.training_objective.net is copy.net and copy.net is not module.net
    assert torch.equal(copy.net.weight, module.net.weight)


class _TwoOutputs(NamedTuple):
    pred: Tensor
    hidden: Tensor


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> _TwoOutputs:
        hidden = torch.tanh(x)
        return _TwoOutputs(self.layer(hidden), hidden)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_objective_hands_back_the_nets_output_detached_and_the_loss_with_its_gradient(compiled, fresh_dynamo):
    """The output is for logging: detached, it is no output of the compiled backward (which would otherwise take
    a zero gradient for each of its tensors at every step). Its values and type are the net's, and the weights'
    gradients are those of the loss alone."""
    net, x, y = _Pair(), torch.randn(5, 3), torch.randn(5, 2)
    objective = TrainingObjective(net, lambda out, y: F.mse_loss(out.pred, y))
    if compiled:
        objective.compile(backend="aot_eager", fullgraph=True)
    loss, out = objective((x,), (y,))
    assert isinstance(out, _TwoOutputs) and not out.pred.requires_grad and not out.hidden.requires_grad
    expected = net(x)
    assert torch.allclose(out.pred, expected.pred) and torch.equal(out.hidden, expected.hidden)
    loss.backward()
    reference = torch.autograd.grad(F.mse_loss(net(x).pred, y), net.layer.weight)[0]
    assert torch.allclose(net.layer.weight.grad, reference)

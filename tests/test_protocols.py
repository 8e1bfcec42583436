"""``implements``: the papers' contract checks find nn.Module members on every Python version.

From Python 3.12 ``isinstance(obj, RuntimeProtocol)`` looks members up with ``inspect.getattr_static``, which
misses the submodules an ``nn.Module`` serves through ``__getattr__``; these tests build exactly that case
(a member reachable only through ``__getattr__``), so they fail on 3.10/3.11 as well if ``implements`` falls
back to static lookup.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Protocol, runtime_checkable

import pytest
from torch import Tensor, nn

import lit_icl
from lit_icl.core.protocols import contract_summary, implements, protocol_members, unmet


@runtime_checkable
class _Headed(Protocol):
    head: nn.Module

    def represent(self, x: Tensor) -> Tensor: ...


@runtime_checkable
class _Named(_Headed, Protocol):
    method: str

    @property
    def width(self) -> int: ...

    def __call__(self, x: Tensor) -> Tensor: ...


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)  # lives in self._modules: only __getattr__ finds it
        self.method = "net"
        self.width = 2

    def represent(self, x: Tensor) -> Tensor:
        return x

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.represent(x))


def test_members_of_a_protocol_and_its_protocol_bases():
    assert protocol_members(_Headed) == (frozenset({"head"}), frozenset({"represent"}))
    attributes, methods = protocol_members(_Named)
    assert attributes == {"head", "method", "width"}  # a property reads like an attribute
    assert methods == {"represent", "__call__"}


def test_a_submodule_counts_as_a_member():
    net = _Net()
    assert inspect.getattr_static(net, "head", None) is None  # the case 3.12's isinstance misses
    assert implements(net, _Headed)
    assert implements(net, _Named)


def test_a_missing_or_uncallable_member_fails():
    net = _Net()
    del net.head
    assert not implements(net, _Headed)
    net = _Net()
    net.represent = 3  # an attribute where the protocol wants a method
    assert not implements(net, _Headed)
    assert not implements(nn.Linear(2, 2), _Headed)


class _Prompted(Protocol):
    method: str

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor: ...


class _OtherNames(nn.Module):
    method = "mine"

    def forward(self, x: Tensor, y: Tensor, x_query: Tensor | None = None) -> Tensor:
        return x


def test_what_is_unmet_is_named_member_by_member_and_empty_when_implemented():
    """The refusals a user extending the package reads: which member is missing, which arguments a method lacks."""
    assert unmet(_OtherNames(), _Prompted) == ["forward(x, y, x_query=None) does not take xs, ys, xq"]
    assert unmet(nn.Linear(2, 2), _Prompted) == ["no attribute method", "forward(input) does not take xs, ys, xq"]
    net = _Net()
    net.represent = 3
    assert unmet(net, _Headed) == ["represent is not callable"]
    del net.head
    assert unmet(net, _Headed) == ["no attribute head", "represent is not callable"]
    for ok in (_Net(), _OtherNames()):
        for protocol in (_Headed, _Named, _Prompted):
            assert (unmet(ok, protocol) == []) == implements(ok, protocol)
    assert contract_summary(_Prompted) == "method: str, forward(xs, ys, xq=None)"


def test_only_protocols_are_accepted():
    with pytest.raises(TypeError, match="not a typing.Protocol"):
        implements(_Net(), _Net)


def test_the_shipped_nets_satisfy_their_contracts():
    from lit_icl.icssl import ICSSLModule, LaplacianEigenmap, SemiSupervisedICL
    from lit_icl.icssl.contracts import TwoStageNet
    from lit_icl.mmca import BidirectionalCrossAttention, MultimodalCrossAttention
    from lit_icl.mmca.contracts import AVMNISTNet

    assert implements(MultimodalCrossAttention(), AVMNISTNet)
    assert implements(BidirectionalCrossAttention(), AVMNISTNet)
    net = SemiSupervisedICL(LaplacianEigenmap())
    assert inspect.getattr_static(net, "representation", None) is None
    assert implements(net, TwoStageNet)
    # What a failed check showed on 3.12: the class name in place of the paper's method name.
    assert ICSSLModule(net).method == "EIG+ICL"


def _runtime_protocols(tree: ast.Module) -> set[str]:
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(d, ast.Name) and d.id == "runtime_checkable" for d in node.decorator_list)
    }


def test_the_package_checks_contracts_with_implements_not_isinstance():
    """An ``isinstance(x, SomeContract)`` in lit_icl would pass here on 3.11 and fail for users on 3.12+."""
    root = Path(lit_icl.__file__).parent
    trees = {path: ast.parse(path.read_text()) for path in root.rglob("*.py")}
    protocols = set().union(*(_runtime_protocols(tree) for tree in trees.values()))
    assert {"AVMNISTNet", "TwoStageNet", "SequenceNet"} <= protocols
    offenders = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(isinstance(c, ast.Name) and c.id in protocols for c in classes):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"use lit_icl.core.protocols.implements at {offenders}"

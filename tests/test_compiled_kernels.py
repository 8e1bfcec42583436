"""``benchmarks/compiled_kernels.py``: how it tells a compiled step's graphs, generated kernels, library calls and
eager ops apart, on a net small enough to count by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script
from torch.profiler import ProfilerActivity, profile, record_function

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def script():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # it imports launches_per_step beside it
    return load_script(BENCHMARKS / "compiled_kernels.py")


class _Net(torch.nn.Module):
    """One linear layer (a library ``addmm`` forward, ``mm`` backward) and pointwise work for inductor to fuse."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(self.lin(x)) * 2.0).sum()


def test_a_compiled_step_is_counted_by_kind_and_the_update_is_left_out(script) -> None:
    torch._dynamo.reset()
    # torch's own config.patch, not monkeypatch (why: tests/conftest.py, _TORCH_CONFIGS).
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        net = _Net()
        net.compile(mode="default")
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(4, 8)
        for _ in range(2):  # compiled, and warm
            (net(x) * 3.0).backward()
            opt.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = net(x) * 3.0  # the graph's forward, then one eager multiplication
        loss.backward()
        with record_function(script.UPDATE):
            pass
        opt.step()  # after the marker: not counted
    kinds, ops, eager = script.tally(list(prof.events()))
    assert kinds["regions"] == 2  # the forward graph and the backward graph
    assert kinds["generated"] >= 2  # at least one fused kernel in each
    # The library calls inside them: the layer's product forward, its weight's gradient backward.
    assert kinds["extern"] == 2 and ops["addmm"] == 1 and ops["mm"] == 1
    # Outside the graphs: the multiplication forward and backward, and the seed of the backward.
    assert kinds["eager"] == 3 and ops["mul"] == 2 and ops["ones_like"] == 1
    # Each with where it ran: the step's own (forward) or the autograd node of the backward.
    assert eager == {"mul (forward)": 1, "ones_like (forward)": 1, "mul (MulBackward0)": 1}
    assert "add_" not in ops  # SGD's update, after the marker


@pytest.mark.parametrize("at", ["0", "-1"])
def test_a_step_that_compiles_is_refused_as_the_step_counted(script, capsys, monkeypatch, at) -> None:
    """Step 0 compiles the graphs: ``--at 0`` used to print its ~2,000 compile-time ops as the step's kernels."""

    def ran(*args, **kwargs):
        raise AssertionError("a study was measured")

    monkeypatch.setattr(script, "measure", ran)
    with pytest.raises(SystemExit) as exit_:
        script.main(["--at", at, "--only", "mmca_synthetic"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    refusal = ("argument --at: must be at least 1 (step 0 compiles the graphs, so its ops are compilation's), "
               f"got {at}")
    assert ": error: " in err[-1] and refusal in err[-1], err

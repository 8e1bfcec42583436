"""``lit_icl.cli.process_defaults``: what ``python -m lit_icl`` sets for its process, which the scripts that build
runs themselves (``benchmarks/``) set too, so that they measure what the CLI runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._functorch.config
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

from lit_icl.cli import app, process_defaults
from lit_icl.core.nets import contiguous_grad
from lit_icl.icssl.nets.eigenmap import LinearAttentionLayer


def _fills_of_a_new_tensor() -> int:
    """``fill_`` ops that making a tensor runs (the profiler sees the one ``empty`` runs inside itself)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.empty(4)
    return sum(event.name == "aten::fill_" for event in prof.events())


@pytest.fixture
def restored():
    """Leave the process as it was: these are process-wide settings."""
    state = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory,
             torch.get_float32_matmul_precision())
    # torch's own patch restores its config on exit (monkeypatch would hide the option from later compiles).
    with torch._functorch.config.patch(autograd_cache_allow_custom_autograd_functions=False):
        yield
    torch.use_deterministic_algorithms(state[0])
    torch.utils.deterministic.fill_uninitialized_memory = state[1]
    torch.set_float32_matmul_precision(state[2])


def test_deterministic_runs_make_no_kernel_to_fill_new_tensors_after_the_process_defaults(restored) -> None:
    """Deterministic mode (the configs' default) fills every new tensor with NaN by itself: a debugging aid that
    costs a kernel per tensor on a GPU. The CLI's process turns it off, and keeps TF32 products on a GPU."""
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    assert _fills_of_a_new_tensor() == 1
    process_defaults()
    assert _fills_of_a_new_tensor() == 0
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.are_deterministic_algorithms_enabled()  # the kernels stay deterministic


def test_the_entry_point_sets_the_process_defaults_before_it_builds_a_run(monkeypatch, restored) -> None:
    calls = []
    monkeypatch.setattr(app, "process_defaults", lambda: calls.append("defaults"))
    with pytest.raises(SystemExit) as refused:
        app.main(["fit", "--config", "no/such/config.yaml"])
    assert refused.value.code == 2 and calls == ["defaults"]


def _compiled_grads(fn, *inputs: torch.Tensor, wrt: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, int]]:
    """Gradients of ``fn(*inputs)`` compiled from nothing in memory (so only the on-disk caches can serve it),
    and what AOTAutograd's cache did for it."""
    torch._dynamo.reset()
    counters.clear()
    loss = torch.compile(fn)(*inputs)
    return list(torch.autograd.grad(loss, wrt)), dict(counters["aot_autograd"])


def _eigenmap_layer() -> tuple[Callable[..., torch.Tensor], list[torch.Tensor], list[torch.nn.Parameter]]:
    """A loss through an IC-SSL eigenmap layer: both Functions (the iterations and ``contiguous_grad``)."""
    layer = LinearAttentionLayer(n_components=2, num_heads=2)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    psi = torch.randn(3, 5, 6)

    def loss(phi: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
        return layer(phi, gram).square().sum()

    return loss, [torch.randn(3, 6, 2), psi.mT @ psi / 5], list(layer.parameters())


def _transposed_weight() -> tuple[Callable[..., torch.Tensor], list[torch.Tensor], list[torch.nn.Parameter]]:
    """A loss through a weight used transposed via ``contiguous_grad``: one Function, a graph that compiles fast."""
    weight = torch.nn.Parameter(torch.randn(3, 4))

    def loss(x: torch.Tensor) -> torch.Tensor:
        return (x @ contiguous_grad(weight).mT).square().sum()

    return loss, [torch.randn(5, 4)], [weight]


@pytest.mark.parametrize("graph", [
    _transposed_weight,
    pytest.param(_eigenmap_layer, marks=pytest.mark.slow),  # 15-20 s of compiling from nothing on 2 CPU cores
], ids=["contiguous_grad", "eigenmap_layer"])
def test_compiled_graphs_with_our_autograd_functions_are_read_back_from_the_cache(
    graph, tmp_path, monkeypatch, restored
) -> None:
    """IC-SSL's nets apply two autograd Functions of ours (the eigenmap iterations and ``contiguous_grad``).
    torch's AOTAutograd cache passes over such a graph unless told otherwise; the CLI's process tells it, so a
    second run of a compiled config reads its training graph back instead of tracing and partitioning it again,
    with the same gradients to the bit."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # an empty cache
    torch.manual_seed(0)
    loss, inputs, params = graph()
    eager = torch.autograd.grad(loss(*inputs), params)
    _, seen = _compiled_grads(loss, *inputs, wrt=params)
    assert seen.get("autograd_cache_bypass") == 1, seen  # torch's default: never cached
    process_defaults()
    first, seen = _compiled_grads(loss, *inputs, wrt=params)
    assert seen.get("autograd_cache_miss") == 1 and seen.get("autograd_cache_saved") == 1, seen
    again, seen = _compiled_grads(loss, *inputs, wrt=params)
    assert seen.get("autograd_cache_hit") == 1 and "autograd_cache_miss" not in seen, seen
    for i, (e, a, b) in enumerate(zip(eager, first, again, strict=True)):
        torch.testing.assert_close(a, e, msg=f"compiled gradient {i} differs from eager")
        assert torch.equal(a, b), f"the cached graph's gradient {i} differs from the one compiled"


def _scaling_grad(scale: float) -> type[torch.autograd.Function]:
    class ScaledGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
            return grad * scale

    return ScaledGrad


def test_an_autograd_function_whose_backward_changed_is_compiled_afresh(tmp_path, monkeypatch, restored) -> None:
    """What makes caching these graphs safe while a researcher edits a hand-written backward: the cache key holds
    the backward Dynamo traced, so the same forward with another backward is not served from the cache."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    process_defaults()
    x = torch.randn(4, requires_grad=True)
    for scale, status in ((2.0, "autograd_cache_miss"), (2.0, "autograd_cache_hit"), (3.0, "autograd_cache_miss")):
        fn = _scaling_grad(scale)
        (grad,), seen = _compiled_grads(lambda x, fn=fn: fn.apply(x).square().sum(), x, wrt=[x])
        assert status in seen, (scale, seen)
        torch.testing.assert_close(grad, 2 * scale * x.detach(), rtol=0, atol=0)

"""``lit_icl.cli.process_defaults``: what ``python -m lit_icl`` sets for its process, which the scripts that build
runs themselves (``benchmarks/``) set too, so that they measure what the CLI runs."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from lit_icl.cli import app, process_defaults


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

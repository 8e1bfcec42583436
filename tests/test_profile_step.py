"""``benchmarks/profile_step.py``: where a profiled step's host time goes, from the profiler's events."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import load_script
from torch.autograd import DeviceType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _event(name: str, us: float, device: DeviceType = DeviceType.CPU) -> SimpleNamespace:
    return SimpleNamespace(name=name, self_cpu_time_total=us, device_type=device)


def test_host_lines_rank_host_events_by_own_time_and_count_the_waits_on_the_device() -> None:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # it imports step_speed beside it
    script = load_script(BENCHMARKS / "profile_step.py")
    events = [
        _event("ProfilerStep#3", 10_000.0),  # the step's own range: not an event of the step
        _event("CompiledFunction", 300.0), _event("CompiledFunction", 300.0),
        _event("cudaGraphLaunch", 50.0), _event("cudaGraphLaunch", 50.0),
        _event("cudaStreamSynchronize", 1_000.0),
        _event("aten::add", 100.0),
        _event("void kernel<float>", 0.0, DeviceType.CUDA),  # device events are the other table's
    ]
    lines = script.host_lines(SimpleNamespace(events=lambda: events), steps=2, top=2)
    assert lines[0] == "  host: 0.900 ms of own CPU time per step in 4 kinds of event; 0.50 waits on the device per step"
    assert lines[1].split() == ["500.0", "us", "55.6", "%", "0.5", "x", "cudaStreamSynchronize"]
    assert lines[2].split() == ["300.0", "us", "33.3", "%", "1.0", "x", "CompiledFunction"]
    assert len(lines) == 3

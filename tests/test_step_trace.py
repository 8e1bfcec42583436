"""``benchmarks/step_trace.py``: a window of a run's training steps under the profiler, and what it says of them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import load_script
from icssl.helpers import tiny_args

from lit_icl.cli import main

TRACE = load_script(Path(__file__).resolve().parents[1] / "benchmarks/step_trace.py")


def _fit(tmp_path: Path, start: int | None, steps: int, report: Path, *extra: str) -> None:
    # 3 training batches per epoch, 2 epochs (global steps 0-5), a validation round after each.
    main(["fit", *tiny_args(tmp_path), "--trainer.callbacks+=step_trace.StepTrace",
          f"--trainer.callbacks.start={'null' if start is None else start}", f"--trainer.callbacks.steps={steps}",
          f"--trainer.callbacks.path={report}", *extra])


def _printed(capsys) -> list[str]:
    return [line.removeprefix(TRACE.PREFIX + " ") for line in capsys.readouterr().out.splitlines()
            if line.startswith(TRACE.PREFIX)]


def test_a_window_of_a_cli_run_is_profiled_and_reported_by_stage(tmp_path, capsys) -> None:
    """Steps 2-4 of a 6-step run (across an epoch's end): each stage's host time per step, the backward and the
    update inside the step, and the report with its table and Chrome trace."""
    report = tmp_path / "trace.txt"
    _fit(tmp_path, start=2, steps=3, report=report)
    printed = _printed(capsys)
    assert printed[0] == "3 steps profiled"
    host = {line.split(":")[0]: float(line.split(": ")[1].split(" ms")[0]) for line in printed[1:4]}
    assert set(host) == {"step", "backward", "update"}
    assert 0 < host["backward"] < host["step"] and 0 < host["update"] < host["step"]
    # On the CPU no CUDA call is made.
    assert all("0.0 CUDA graph launches, 0.0 kernel launches, 0.0 synchronising calls (0.00 ms waiting), 0.00 ms in "
               "all CUDA calls" in line for line in printed[1:4])
    assert printed[4].startswith("between steps: ") and printed[-1].startswith("most host time per step (self): ")
    text = report.read_text()
    assert text.startswith("3 steps profiled\n") and "Self CPU" in text
    assert report.with_suffix(".json").stat().st_size > 0


@pytest.mark.slow  # 3 s of benchmark tooling; one traced window stays in the default suite (test_a_window_of_a_cli_run_...)
def test_a_run_that_ends_inside_the_window_reports_its_steps_and_one_that_ends_before_reports_nothing(
        tmp_path, capsys) -> None:
    inside = tmp_path / "inside.txt"
    _fit(tmp_path / "a", start=4, steps=10, report=inside)
    assert inside.read_text().startswith("2 steps profiled\n")
    capsys.readouterr()
    before = tmp_path / "before.txt"
    _fit(tmp_path / "b", start=50, steps=5, report=before)
    assert not before.exists() and TRACE.PREFIX not in capsys.readouterr().out


@pytest.mark.slow  # 4 s of benchmark tooling; one traced window stays in the default suite (test_a_window_of_a_cli_run_...)
def test_a_validation_round_is_profiled_by_batch_beside_the_training_window(tmp_path, capsys) -> None:
    """Round 2 (the validation after the second epoch) with 8-episode batches: two batches, the round around them;
    the training window (steps 0-1) reports apart; the round's report is written as ``<name>-val``."""
    report = tmp_path / "trace.txt"
    _fit(tmp_path, 0, 2, report, "--trainer.callbacks.val_round=2", "--data.init_args.eval_batch_size", "8")
    printed = _printed(capsys)
    assert printed[0] == "2 steps profiled"
    val = [line.removeprefix("validation round 2: ") for line in printed if line.startswith("validation round 2: ")]
    assert val[0] == "2 batches profiled"
    batch = float(val[1].split("val_batch: ")[1].split(" ms")[0])
    round_ms = float(val[2].split("round: ")[1].split(" ms")[0])
    assert val[2].startswith("round: ") and 2 * batch < round_ms
    assert val[3].startswith("between batches: ") and val[-1].startswith("most host time per batch (self): ")
    assert (tmp_path / "trace-val.txt").read_text().startswith("validation round 2: 2 batches profiled\n")
    # Only a round: no training window.
    _fit(tmp_path / "b", None, 1, tmp_path / "b.txt", "--trainer.callbacks.val_round=1")
    printed = _printed(capsys)
    assert printed[0] == "validation round 1: 1 batch profiled"
    assert (tmp_path / "b-val.txt").is_file() and not (tmp_path / "b.txt").exists()


def test_a_trace_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing to profile"):
        TRACE.StepTrace(start=None)
    with pytest.raises(ValueError, match="val_round=0"):
        TRACE.StepTrace(val_round=0)


def _event(name: str, start: float, end: float, thread: int = 1) -> SimpleNamespace:
    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(name=name, time_range=span, thread=thread, device_type=torch.autograd.DeviceType.CPU)


def test_cuda_calls_count_in_the_ranges_they_fall_in_on_any_thread() -> None:
    """Two steps; the backward's graph launch and wait come from autograd's own thread, as on a GPU; calls between
    the steps (the next batch's pinning and copy) count between them, in no step; kernel time on the device is not
    a host call."""
    step, backward = TRACE._range("step"), TRACE._range("backward")
    events = [
        _event(step, 0, 1000), _event(backward, 100, 900),
        _event(step, 2000, 3000), _event(backward, 2100, 2900),
        _event("cudaGraphLaunch", 200, 210, thread=2), _event("cudaGraphLaunch", 2200, 2210, thread=2),
        _event("cudaStreamSynchronize", 300, 800, thread=2),  # 500 us waiting, in step 1's backward
        _event("cudaLaunchKernel", 950, 960), _event("cudaLaunchKernel", 2950, 2960),  # after the backward
        _event("cudaMemcpyAsync", 1500, 1510), _event("cudaHostAlloc", 1600, 1900),  # between the steps
        _event("cudaHostAlloc", 2300, 2700), _event("cudaEventRecord", 2800, 2802),  # other calls, in step 2's backward
    ]
    device = SimpleNamespace(name="triton_poi_fused_0", time_range=SimpleNamespace(start=250, end=260),
                             thread=0, device_type=torch.autograd.DeviceType.CUDA)
    averages = [SimpleNamespace(key="aten::bmm", self_cpu_time_total=4000.0, count=10),
                SimpleNamespace(key=step, self_cpu_time_total=9000.0, count=2),
                SimpleNamespace(key="aten::mm", self_cpu_time_total=1000.0, count=4)]
    prof = SimpleNamespace(events=lambda: [*events, device], key_averages=lambda: averages)
    lines = TRACE.summarize(prof, top=5)
    assert lines == [
        "2 steps profiled",
        ("step: 1.00 ms of host time per step; per step 1.0 CUDA graph launches, 1.0 kernel launches, 0.5 "
         "synchronising calls (0.25 ms waiting), 0.47 ms in all CUDA calls"),
        "step: other CUDA calls per step: cudaHostAlloc 0.5x (0.20 ms), cudaEventRecord 0.5x (0.00 ms)",
        ("backward: 0.80 ms of host time per step; per step 1.0 CUDA graph launches, 0.0 kernel launches, 0.5 "
         "synchronising calls (0.25 ms waiting), 0.46 ms in all CUDA calls"),
        "backward: other CUDA calls per step: cudaHostAlloc 0.5x (0.20 ms), cudaEventRecord 0.5x (0.00 ms)",
        ("between steps: 1.00 ms of host time per step (the next batch, Lightning's loop); per step 0.0 CUDA graph "
         "launches, 0.0 kernel launches, 0.0 synchronising calls (0.00 ms waiting), 0.31 ms in all CUDA calls"),
        "between steps: other CUDA calls per step: cudaHostAlloc 1.0x (0.30 ms), cudaMemcpyAsync 1.0x (0.01 ms)",
        "most host time per step (self): aten::bmm 2.00 ms (5.0x), aten::mm 0.50 ms (2.0x)",
    ]


def test_the_allocators_counters_over_a_window_are_given_per_step() -> None:
    """Over 4 steps, 8 pinned allocations taking 2 ms and 2 device allocations: per step; a counter this torch does
    not keep is left out; off CUDA there are no counters."""
    before = {"cudaMalloc": 10.0, "cudaFree": 3.0, "allocator retries": 0.0, "pinned host allocations": 5.0,
              "pinned allocation us": 1000.0}
    after = {"cudaMalloc": 12.0, "cudaFree": 3.0, "allocator retries": 0.0, "pinned host allocations": 13.0,
             "pinned allocation us": 3000.0}
    assert TRACE.allocator_line(before, after, 4, "step") == (
        "allocators per step: 0.50 cudaMalloc, 0.00 cudaFree, 0.00 allocator retries, 2.00 pinned host allocations, "
        "0.50 ms in them")
    older = {k: v for k, v in before.items() if not k.startswith("pinned")}
    assert TRACE.allocator_line(older, older, 2, "batch") == (
        "allocators per batch: 0.00 cudaMalloc, 0.00 cudaFree, 0.00 allocator retries")
    assert TRACE.allocator_counters(torch.device("cpu")) == {}


def test_a_python_traced_window_lists_each_stages_functions_by_self_time_on_the_threads_that_work() -> None:
    """Self times per step in each range, summed over the step's thread and autograd's (which runs ops), not over a
    thread that only waits; names lose their machine's folders and object addresses."""
    step, backward = TRACE._range("step"), TRACE._range("backward")

    def ev(name: str, start: float, end: float, self_us: float, thread: int = 1) -> SimpleNamespace:
        e = _event(name, start, end, thread)
        e.self_cpu_time_total = self_us
        return e

    root = str(Path(TRACE.__file__).resolve().parents[1])
    events = [
        ev(step, 0, 1000, 50), ev(backward, 100, 900, 10), ev(step, 2000, 3000, 50), ev(backward, 2100, 2900, 10),
        ev("/usr/lib/python3.12/site-packages/torch/_inductor/cudagraph_trees.py(1999): run", 200, 700, 400, 2),
        ev("aten::mm", 710, 720, 10, 2),  # autograd's thread runs ops: its Python counts
        ev("/usr/lib/python3.12/site-packages/torch/_inductor/cudagraph_trees.py(1999): run", 2200, 2500, 200, 2),
        ev(f"{root}/lit_icl/icssl/module.py(80): training_step", 10, 90, 80),
        ev("<built-in method acquire of _thread.lock object at 0x7f93a1c2>", 1200, 1900, 700),
        ev("<built-in method acquire of _thread.lock object at 0x7f93a1c2>", 0, 3000, 3000, 3),  # a waiting thread
    ]
    prof = SimpleNamespace(events=lambda: events, key_averages=list)
    lines = TRACE.summarize(prof, top=2, python=True)
    by_range = {line.split(": most")[0]: line.split("ops): ")[1] for line in lines if "(self, Python" in line}
    assert by_range["step"] == ("torch/_inductor/cudagraph_trees.py(1999): run 0.30 ms (1.0x), "
                                "lit_icl/icssl/module.py(80): training_step 0.04 ms (0.5x)")
    assert by_range["backward"] == ("torch/_inductor/cudagraph_trees.py(1999): run 0.30 ms (1.0x), "
                                    "aten::mm 0.01 ms (0.5x)")
    assert by_range["between steps"] == "<built-in method acquire of _thread.lock object> 0.70 ms (1.0x)"
    assert not any("/usr/" in line or root in line or "0x7f" in line for line in lines)
    assert TRACE.traced_name("/tmp/torchinductor_me/ie/cieyjb4m.py(5516): call") == "cieyjb4m.py(5516): call"
    assert TRACE.traced_name("/usr/lib/python3.12/threading.py(295): wait") == "threading.py(295): wait"
    assert TRACE.traced_name("aten::bmm") == "aten::bmm"
    # Without python=True, no such lines.
    assert not any("(self, Python" in line for line in TRACE.summarize(prof, top=2))


@pytest.mark.slow  # 4 s of benchmark tooling; one traced window stays in the default suite (test_a_window_of_a_cli_run_...)
def test_two_windows_trace_apart_and_one_that_overlaps_another_is_given_up(tmp_path, capsys) -> None:
    """In one run: a rates window (steps 0-1), a Python window (steps 3-4), and a Python window over steps 1-2 that
    overlaps the first and is not recorded, with a line saying why (one profiler records at a time)."""
    python = ("--trainer.callbacks+=step_trace.StepTrace", "--trainer.callbacks.steps=2",
              "--trainer.callbacks.python=true")
    _fit(tmp_path, 0, 2, tmp_path / "a.txt", *python, "--trainer.callbacks.start=3",
         *python, "--trainer.callbacks.start=1")
    printed = _printed(capsys)
    assert printed[0] == "python-traced training window not profiled: another profiler was recording"
    assert printed[1] == "2 steps profiled" and printed.count("python-traced 2 steps profiled") == 1
    traced = [line for line in printed if line.startswith("python-traced ")]
    assert any(line.startswith("python-traced backward: most host time per step (self, Python functions and ops): ")
               for line in traced)
    assert sum(line.endswith(" steps profiled") or " profiled:" in line for line in printed) == 3


def test_run_as_a_script_it_gives_help_and_refuses_to_run_silently(capsys) -> None:
    """``--help`` describes the module and where its callbacks are used; a bare run says what to run instead
    (both used to print nothing and exit 0)."""
    with pytest.raises(SystemExit) as exit_:
        TRACE.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Where a run's host time goes" in out and "main_command.py --trace" in out
    with pytest.raises(SystemExit) as exit_:
        TRACE.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ": error: nothing to run here" in err[-1], err

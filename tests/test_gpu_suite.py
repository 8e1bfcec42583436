"""``benchmarks/gpu_suite.py``: its CPU dry run reaches every step's code path and writes the report; its
parsers read the numbers the benchmark scripts print."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _suite():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_suite.py imports blas_host beside it
    return load_script(ROOT / "benchmarks/gpu_suite.py")


def test_the_dry_run_runs_a_step_and_reports_it_with_device_and_command(tmp_path: Path) -> None:
    suite = _suite()
    out = tmp_path / "gpu.md"
    # eigh_route: the step whose dry run takes the fewest seconds (the others train a net).
    assert suite.main(["--dry-run", "--out", str(out), "--only", "eigh_route"]) == 0
    text = out.read_text()
    assert text.startswith("# GPU suite (CPU dry run")
    assert "Device: CPU only" in text and "Commit: " in text
    (row,) = [ln for ln in text.splitlines() if ln.startswith("| eigh_route |")]
    assert "| ok |" in row
    assert re.search(r"\| \(8, 100, 100\): device [\d.]+ ms, device route [\d.]+ ms \|$", row), row
    assert "$ python benchmarks/eigh_route.py --device cpu --batches 8 --repeats 1" in text


def test_without_a_gpu_the_full_suite_refuses_and_names_the_dry_run(capsys) -> None:
    suite = _suite()
    if suite.torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit) as info:
        suite.main([])
    assert info.value.code == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_unknown_step_names_are_refused_with_the_choices(capsys) -> None:
    with pytest.raises(SystemExit):
        _suite().main(["--dry-run", "--only", "coqe_regresion"])
    assert "unknown step(s) coqe_regresion; choose from blas_host, compile_cache_icssl, coqe_omniglot_bf16" in capsys.readouterr().err


def test_headlines_read_each_scripts_output() -> None:
    suite = _suite()
    steps = {step.name: step for step in suite.STEPS}
    omniglot = ("device cuda\ncoqe E=512 L=4: 2.05M parameters\n  bare loop :  20.000 steps/s (data 3.0 % of the step)\n"
                "  Lightning :  25.000 steps/s (1.25 x bare)\n")
    # 10^5 steps at 25 steps/s: 4,000 s = 1.1 h.
    assert suite.headline(steps["coqe_omniglot_fp32"], omniglot) == (
        "coqe E=512 L=4: Lightning 25.000 steps/s (1.25 x bare), 10^5 steps in 1.1 h")
    latency = "| method | median ms/query | mean ms/query | median / zero-shot |\n|---|---|---|---|\n" \
              "| zero_shot | 10.0 | 11.0 | 1.00 |\n| few_shot | 35.5 | 36.0 | 3.55 |\n"
    assert suite.headline(steps["i2cl_latency_bf16"], latency) == (
        "zero_shot 10.0 ms (1.00 x zero-shot), few_shot 35.5 ms (3.55 x zero-shot)")
    profile = ("mode=reduce-overhead: 12.345 ms of wall time per step under the profiler\n"
               "  kernels: 512 per step, 10.500 ms per step\n    9000.0 us  85.7 %    29.0 x  conv\n"
               "mode=off: 30.000 ms of wall time per step under the profiler\n"
               "  kernels: 1000 per step, 11.250 ms per step\n")
    assert suite.headline(steps["profile_coqe"], profile) == (
        "reduce-overhead: 512 kernels, 10.500 ms per step, off: 1000 kernels, 11.250 ms per step")
    assert suite.headline(steps["coqe_regression"], "  ours / HF           :    1.700\n") == "ours / HF : 1.700"
    eigh = ("device: NVIDIA H200; torch 2.11.0; host threads 16\n"
            "eigh (64, 100, 100) float32: on the device 117.0 ms, symmetric_eigenvectors (host route) 21.5 ms (5.4x); "
            "laplacian_eigenmap 23.0 ms\n")
    assert suite.headline(steps["eigh_route"], eigh) == "(64, 100, 100): device 117.0 ms, host route 21.5 ms"
    pytest_out = "tests/test_early_stopping.py .\n\n-- Docs: https://docs.pytest.org\n1 passed, 2 warnings in 5.22s\n"
    assert suite.headline(steps["cuda_tests"], pytest_out) == "1 passed, 2 warnings in 5.22s"
    assert suite.headline(steps["cuda_tests"], "==== 1 failed, 1 passed in 3.00s ====\n") == "1 failed, 1 passed in 3.00s"
    cut = ("tests/core/test_data.py::test_to_device PASSED  [  7%]\n"
           "tests/core/test_step_syncs.py::test_steps[icssl] FAILED  [ 14%]\n"
           "tests/core/test_step_syncs.py::test_steps[coqe] PASSED  [ 21%]\n")  # stopped by the lease: no summary
    assert suite.headline(steps["cuda_tests"], cut) == "stopped after 2 passed, 1 failed"
    h2d = ("copy 6.8 KiB: pageable non-blocking 0.006 ms, pinned non-blocking 0.004 ms, blocking 20.1 ms, pin_memory() "
           "0.010 ms; pageable waited for the queue: no\ncopy 25.7 MiB: pageable non-blocking 21.386 ms, pinned "
           "non-blocking 0.005 ms, blocking 22.2 ms, pin_memory() 2.0 ms; pageable waited for the queue: yes\n")
    assert suite.headline(steps["h2d_copy"], h2d) == (
        "pageable copies waited at 25.7 MiB; pinned copies took at most 0.005 ms of host time")
    vote = ("2 gloo ranks on cpu; torch 2.14.1; 3 ms of host time per step; 300 steps after 20\n"
            "boundary none: 333.0 steps/s, boundary host time 0 us (median, slower rank)\n"
            "boundary lightning: 237.1 steps/s, boundary host time 212 us (median, slower rank)\n"
            "boundary vote: 307.9 steps/s, boundary host time 57 us (median, slower rank)\n")
    assert suite.headline(steps["ddp_stop_vote"], vote) == (
        "none 333.0 steps/s (0 us at the boundary), lightning 237.1 steps/s (212 us at the boundary), "
        "vote 307.9 steps/s (57 us at the boundary)")
    blas = ("device cuda, torch 2.11.0, 2000 calls per round\n"
            "blas=cublas deterministic=false bmm 64x100x100 @ 64x100x4 (a power step): host 12.50 us per call, all-in "
            "13.00 us per call\n"
            "blas=cublas deterministic=false mm 6400x16 @ 16x16 (a token projection): host 11.00 us per call, all-in "
            "11.50 us per call\n"
            "blas=cublas deterministic=false add 8 floats (one elementwise kernel, for reference): host 5.10 us per "
            "call, all-in 5.20 us per call\n"
            "blas=cublaslt deterministic=true bmm 64x100x100 @ 64x100x4 (a power step): host 88.00 us per call, "
            "all-in 88.10 us per call\n")
    assert suite.headline(steps["blas_host"], blas) == (
        "cublas bmm 12.50 us, cublas add 5.10 us, cublaslt deterministic bmm 88.00 us")
    assert suite.headline(steps["h2d_copy"], "copy 6.8 KiB: pageable non-blocking 0.006 ms, blocking 0.005 ms; "
                          "pageable waited for the queue: n/a\n") == "no GPU: no queue to wait for"
    traced = ("mode=reduce-overhead :    37.50 steps/s all-in, 1369 steps in 91 s of wall time; 10^5 steps would "
              "take 44 min; last validation: none\n"
              "mode=reduce-overhead : trace: 20 steps profiled\n"
              "mode=reduce-overhead : trace: step: 26.10 ms of host time per step; per step 2.0 CUDA graph launches, "
              "3.0 kernel launches, 1.0 synchronising calls (0.10 ms waiting)\n"
              "mode=reduce-overhead : trace: backward: 22.58 ms of host time per step; per step 1.0 CUDA graph "
              "launches, 0.0 kernel launches, 0.0 synchronising calls (0.00 ms waiting)\n"
              "mode=reduce-overhead : trace: between steps: 5.25 ms of host time per step (the next batch, "
              "Lightning's loop); per step 0.0 CUDA graph launches, 1.0 kernel launches, 0.0 synchronising calls\n"
              "mode=reduce-overhead : trace: allocators per step: 0.00 cudaMalloc, 3.00 pinned host allocations\n"
              "mode=reduce-overhead : trace: validation round 2: val_batch: 40.00 ms of host time per batch; per "
              "batch 8.0 CUDA graph launches, 30.0 kernel launches, 2.0 synchronising calls (1.00 ms waiting)\n")
    assert suite.headline(steps["trace_icssl"], traced) == (
        "reduce-overhead: 37.50 steps/s all-in (10^5 steps in 44 min); reduce-overhead step 26.10 ms host, 2.0 graph "
        "/ 3.0 kernel launches; reduce-overhead backward 22.58 ms host, 1.0 graph / 0.0 kernel launches; "
        "reduce-overhead between steps 5.25 ms host, 0.0 graph / 1.0 kernel launches; reduce-overhead val_batch "
        "40.00 ms host, 8.0 graph / 30.0 kernel launches; reduce-overhead allocators per step: 0.00 cudaMalloc, "
        "3.00 pinned host allocations")
    i2cl = ("mode=off             :     40.0 ms/step steady,     0.5 s more in the first 10 steps, 0 graphs, 2.0 s\n"
            "mode=reduce-overhead :      5.0 ms/step steady,    60.0 s more in the first 10 steps, 2 graphs, 61.0 s\n"
            "mode=reduce-overhead: 8.00x eager per step; compilation pays for itself after 1714 steps\n")
    assert suite.headline(steps["i2cl_compile"], i2cl) == (
        "off 40.0 ms/step (+0.5 s), reduce-overhead 5.0 ms/step (+60.0 s); reduce-overhead 8.00x, break-even 1714 steps")


def test_the_goals_table_reads_the_rates_ratios_and_deterministic_cost_with_cuda_graphs() -> None:
    """The report's goal table: the two all-in rates against 100 and 200 steps/s, and per step-speed step
    Lightning / bare against 0.95 and deterministic kernels against +5 %; eager numbers are not goals."""
    suite = _suite()
    steps = {step.name: step for step in suite.STEPS}

    def ran(name: str, output: str) -> tuple:
        return steps[name], {"output": output, "status": "ok", "seconds": 1.0, "cmd": "python x"}

    results = [
        ran("main_command", "mode=reduce-overhead :   104.50 steps/s all-in, 9000 steps\n"
                            "mode=off             :    27.00 steps/s all-in, 2000 steps\n"),
        ran("icssl_cli", "mode=reduce-overhead :   150.25 steps/s all-in, 9000 steps\n"),
        ran("step_speed_coqe", "ratio lightning/bare mode=off deterministic=true: 0.780\n"
                               "ratio lightning/bare mode=reduce-overhead deterministic=true: 0.931\n"
                               "deterministic cost lightning mode=reduce-overhead: -6.5 % time\n"),
        ran("step_speed_icssl", "deterministic cost lightning mode=reduce-overhead: +7.0 % time\n"),
    ]
    assert suite.goal_rows(results) == [
        ("the main command, all-in", "104.5 steps/s", ">= 100 steps/s", True),
        ("IC-SSL manifolds CLI, all-in", "150.2 steps/s", ">= 200 steps/s", False),
        ("step_speed_coqe: Lightning / bare", "0.931", ">= 0.95", False),
        ("step_speed_coqe: deterministic kernels", "-6.5 % time", "<= +5 %", True),
        ("step_speed_icssl: deterministic kernels", "+7.0 % time", "<= +5 %", False),
    ]
    text = suite.report(results, dry=False, started=suite.dt.datetime(2026, 11, 27))
    assert "| the main command, all-in | 104.5 steps/s | >= 100 steps/s | yes |" in text
    assert "None of the steps" in suite.report([], dry=True, started=suite.dt.datetime(2026, 11, 27))
    assert "\nHost: " not in text  # no host measure given, no line
    hosted = suite.report(results, dry=False, started=suite.dt.datetime(2026, 11, 27), host="a CPU, 2 cores")
    assert "\nHost: a CPU, 2 cores.\n" in hosted


def test_the_host_line_names_the_cpu_and_what_a_call_and_a_small_op_cost_here() -> None:
    line = _suite().host_line(dry=True)
    assert re.fullmatch(r".+, \d+ cores, \d+ torch threads; \d+ ns per Python call; [\d.]+ us per torch\.add of 8 "
                        r"floats on the CPU", line), line


def test_the_step_time_limits_fit_120_minutes_and_the_speed_goals_15() -> None:
    """A lent GPU comes for 15 minutes: the three steps the speed goals are judged by fit in them."""
    steps = _suite().STEPS
    assert sum(step.timeout_s for step in steps) <= 120 * 60
    assert [step.name for step in steps[:3]] == ["main_command", "icssl_cli", "step_speed_icssl"]
    assert sum(step.timeout_s for step in steps[:3]) <= 15 * 60


def test_headlines_of_the_compiled_step_scripts() -> None:
    suite = _suite()
    steps = {step.name: step for step in suite.STEPS}
    main_command = ("$ python -m lit_icl fit --config configs/coqe_omniglot.yaml\n"
                    "mode=reduce-overhead :   120.50 steps/s all-in, 9000 steps in 100 s of wall time; 10^5 steps would "
                    "take 14 min; last validation: val/acc/icl 0.600\n"
                    "mode=off             :    27.00 steps/s all-in, 2549 steps in 100 s of wall time; 10^5 steps would "
                    "take 62 min; last validation: none\n")
    assert suite.headline(steps["main_command"], main_command) == (
        "reduce-overhead: 120.50 steps/s all-in (10^5 steps in 14 min), off: 27.00 steps/s all-in "
        "(10^5 steps in 62 min)")
    steady = main_command + ("mode=reduce-overhead :   130.25 steps/s between the first and last of 7 validation "
                             "rounds (validation and checkpoints included, compilation done)\n")
    assert suite.headline(steps["main_command"], steady).startswith(
        "reduce-overhead: 120.50 steps/s all-in (10^5 steps in 14 min; 130.25 between validations), off: 27.00")
    speed = ("lightning mode=off              deterministic=true :    10.00 steps/s\n"
             "bare      mode=off              deterministic=true :    11.00 steps/s\n"
             "lightning mode=reduce-overhead  deterministic=true :   240.00 steps/s\n"
             "bare      mode=reduce-overhead  deterministic=true :   250.00 steps/s\n"
             "lightning mode=off              deterministic=false:    12.00 steps/s\n"
             "ratio lightning/bare mode=off deterministic=true: 0.909\n"
             "ratio lightning/bare mode=reduce-overhead deterministic=true: 0.960\n")
    assert suite.headline(steps["step_speed_icssl"], speed) == (
        "lightning off 10.00, lightning reduce-overhead 240.00; lightning/bare off 0.909, reduce-overhead 0.960")


def test_the_compile_cache_headline_reads_each_runs_compiling_and_wall_time() -> None:
    """From the lines ``compile_cache.py`` prints: a run that read its training graph back compiled no backward."""
    suite, script = _suite(), load_script(ROOT / "benchmarks/compile_cache.py")
    step = next(step for step in suite.STEPS if step.name == "compile_cache_icssl")
    said = ["3 graphs compiled (42.9 s), 1 backward graph compiled (24.6 s); after the first validation round: none",
            "3 graphs compiled (5.6 s); after the first validation round: none"]
    output = "\n".join(["$ python benchmarks/compile_cache.py --config configs/icssl/manifolds.yaml",
                        *(script.report_line("as the CLI sets it", i, s, w) for i, (s, w) in enumerate(
                            zip(said, (78.31, 17.44), strict=True)))])
    assert suite.headline(step, output) == (
        "run 1 (empty cache) 3 graphs 42.9 s + 1 backward 24.6 s, 78.3 s wall, "
        "run 2 (cache left by run 1) 3 graphs 5.6 s, no backward compiled, 17.4 s wall")
    assert script.compile_line("noise\nlit_icl: compilation in this run: " + said[1] + "\n") == said[1]
    assert script.compile_line("lit_icl: error: no such config\n") is None  # a failed run compiled nothing


def test_short_forms_keep_each_steps_script_and_the_modes_the_goals_are_judged_by() -> None:
    """--short (a lease's minutes) runs the same script as the full step, with CUDA graphs and eager both timed
    where the step compares them, and deterministic kernels on and off."""
    suite = _suite()
    for step in suite.STEPS:
        short = step.argv(dry=False, short=True)
        assert short[0] == step.gpu[0], step.name
        assert step.argv(dry=True, short=True) == step.dry
        if step.script.endswith("step_speed.py"):
            modes = short[short.index("--modes") + 1].split(",")
            assert "reduce-overhead" in modes, step.name
            if "off" in step.gpu[step.gpu.index("--modes") + 1].split(","):  # a step that compares with eager
                assert "off" in modes, step.name
            assert short[short.index("--deterministic") + 1] == "true,false"
    main_command = next(step for step in suite.STEPS if step.name == "main_command")
    assert main_command.argv(dry=False, short=True)[1:3] == ["--modes", "reduce-overhead"]


@pytest.mark.slow  # 5 s of dry-run steps spending a budget; the refusal of a bad budget stays in the default suite
def test_the_budget_stops_a_step_at_what_is_left_and_skips_the_rest(tmp_path: Path) -> None:
    """With 36 s for two steps of over 10 s each, the first is stopped at what is left less the 30 s grace (with
    the processes it started) and reported as timed out, the second is reported as not run; the report names both."""
    suite = _suite()
    out = tmp_path / "gpu.md"
    assert suite.main(["--dry-run", "--budget", "36", "--out", str(out), "--only", "icssl_cli,coqe_regression"]) == 1
    rows = {ln.split(" | ")[0][2:]: ln for ln in out.read_text().splitlines() if ln.startswith("| ") and " | " in ln}
    assert re.search(r"\| timed out after [56] s \|", rows["icssl_cli"])
    assert "| not run: --budget spent |" in rows["coqe_regression"]
    assert "Command: `python benchmarks/gpu_suite.py --dry-run --budget 36" in out.read_text()


def test_a_budget_that_is_not_positive_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        _suite().main(["--dry-run", "--budget", "0"])
    assert info.value.code == 2
    assert "argument --budget: must be more than 0 seconds, got 0" in capsys.readouterr().err

"""``benchmarks/gpu_suite.py``: its CPU dry run reaches every step's code path and writes the report; its
parsers read the numbers the benchmark scripts print."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _suite():
    return load_script(ROOT / "benchmarks/gpu_suite.py")


def test_the_dry_run_runs_a_step_and_reports_it_with_device_and_command(tmp_path: Path) -> None:
    suite = _suite()
    out = tmp_path / "gpu.md"
    assert suite.main(["--dry-run", "--out", str(out), "--only", "coqe_regression"]) == 0
    text = out.read_text()
    assert text.startswith("# GPU suite (CPU dry run")
    assert "Device: CPU only" in text and "Commit: " in text
    (row,) = [ln for ln in text.splitlines() if ln.startswith("| coqe_regression |")]
    assert "| ok |" in row
    assert "transformer: Lightning " in row and "coqe: Lightning " in row and " x bare)" in row
    assert "$ python benchmarks/coqe_regression_throughput.py --device cpu" in text


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
    assert "unknown step(s) coqe_regresion; choose from coqe_omniglot_bf16" in capsys.readouterr().err


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
    icssl = "config: x\nlightning: 9.50 steps/s  (runs: 9.50)\nbare loop: 10.00 steps/s  (runs: 10.00)\nratio lightning/bare: 0.950\n"
    assert suite.headline(steps["icssl_deterministic"], icssl) == "lightning 9.50, bare loop 10.00, ratio lightning/bare 0.950"
    assert suite.headline(steps["coqe_regression"], "  ours / HF           :    1.700\n") == "ours / HF : 1.700"
    pytest_out = "tests/test_early_stopping.py .\n\n-- Docs: https://docs.pytest.org\n1 passed, 2 warnings in 5.22s\n"
    assert suite.headline(steps["cuda_tests"], pytest_out) == "1 passed, 2 warnings in 5.22s"
    assert suite.headline(steps["cuda_tests"], "==== 1 failed, 1 passed in 3.00s ====\n") == "1 failed, 1 passed in 3.00s"


def test_the_step_time_limits_fit_80_minutes_and_the_speed_goals_15() -> None:
    """A lent GPU comes for 15 minutes: the three steps the speed goals are judged by fit in them."""
    steps = _suite().STEPS
    assert sum(step.timeout_s for step in steps) <= 80 * 60
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
    speed = ("lightning mode=off              deterministic=true :    10.00 steps/s\n"
             "bare      mode=off              deterministic=true :    11.00 steps/s\n"
             "lightning mode=reduce-overhead  deterministic=true :   240.00 steps/s\n"
             "bare      mode=reduce-overhead  deterministic=true :   250.00 steps/s\n"
             "lightning mode=off              deterministic=false:    12.00 steps/s\n"
             "ratio lightning/bare mode=off deterministic=true: 0.909\n"
             "ratio lightning/bare mode=reduce-overhead deterministic=true: 0.960\n")
    assert suite.headline(steps["step_speed_icssl"], speed) == (
        "lightning off 10.00, lightning reduce-overhead 240.00; lightning/bare off 0.909, reduce-overhead 0.960")

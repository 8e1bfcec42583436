"""``benchmarks/blas_host.py``: host time per matrix product launched from Python (run here on the CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))  # it imports bench_options beside it
BLAS = load_script(BENCHMARKS / "blas_host.py")


def test_each_case_is_timed_with_deterministic_kernels_on_and_off_and_the_setting_is_restored(capsys) -> None:
    before = torch.are_deterministic_algorithms_enabled()
    assert BLAS.main(["--device", "cpu", "--calls", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("blas=")]
    assert len(lines) == 2 * len(BLAS.CASES)
    for line, (det, (name, _)) in zip(lines, [(d, c) for d in ("false", "true") for c in BLAS.CASES]):
        assert line.startswith(f"blas=default deterministic={det} {name}: host ")
        host, all_in = (float(part.split()[0]) for part in line.split(": host ")[1].split(", all-in "))
        assert 0 < host <= all_in
    assert torch.are_deterministic_algorithms_enabled() == before


def test_the_settings_are_each_library_on_a_gpu_and_the_default_on_a_cpu() -> None:
    assert BLAS.settings(torch.device("cpu"), ["cublas", "cublaslt"]) == [("default", False), ("default", True)]
    assert BLAS.settings(torch.device("cuda"), ["cublas", "cublaslt"]) == [
        ("cublas", False), ("cublas", True), ("cublaslt", False), ("cublaslt", True)]


def test_the_cases_are_the_products_they_name() -> None:
    """Each case's operands give the product its name says (shapes of the result), on the device asked for."""
    for name, make in BLAS.CASES:
        op, args = make(torch.device("cpu"))
        assert name.startswith(op)
        out = getattr(torch, op)(*args)
        if op == "bmm":
            assert out.shape == (64, 100, int(name.split(" @ ")[1].split()[0].split("x")[-1]))
        elif op == "mm":
            assert out.shape == (6400, 16)


def test_bad_arguments_are_refused_with_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        BLAS.main(["--device", "cpu", "--calls", "0"])
    assert exit_info.value.code == 2
    assert "argument --calls: must be at least 1, got 0" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_info:
            BLAS.main(["--device", "cuda"])
        assert exit_info.value.code == 2 and "no CUDA GPU is visible" in capsys.readouterr().err

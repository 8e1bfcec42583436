"""The benchmark scripts' refusals: counts that measure nothing, a GPU option without a GPU and a config a script
cannot run end with status 2 and one ``error:`` line before any work starts, not with a traceback or a report of
zeros after the work. Every script that takes a count checks it with ``benchmarks/bench_options.py``'s types; a row
per script here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

#: (script, the function whose call starts the work, argv, words of the refusal)
ROWS = [
    ("data_speed", "process_defaults", ["--config", "configs/icssl/manifolds.yaml", "--batches", "0"],
     "argument --batches: must be at least 1, got 0"),
    ("data_speed", "process_defaults", ["--config", "configs/icssl/manifolds.yaml", "--workers", "-1"],
     "argument --workers: must be at least 0, got -1"),
    ("eval_round", "process_defaults", ["--config", "configs/icssl/manifolds.yaml", "--batches", "0"],
     "argument --batches: must be at least 1 (or left out for all), got 0"),
    ("launches_per_step", "measure", ["--only", "mmca_synthetic", "--steps", "0"],
     "argument --steps: must be at least 1, got 0"),
    ("launches_per_step", "measure", ["--only", "mmca_synthetic", "--warmup", "-1"],
     "argument --warmup: must be at least 0, got -1"),
    ("loop_overhead", "process_defaults", ["--steps", "5", "--warmup", "1", "--repeats", "0"],
     "argument --repeats: must be at least 1, got 0"),
    ("loop_overhead", "process_defaults", ["--steps", "5", "--warmup", "-1"],
     "argument --warmup: must be at least 0, got -1"),
    ("loop_overhead", "process_defaults", ["--steps", "5", "--warmup", "5"],
     "--warmup must be smaller than --steps"),
    ("train_throughput", "process_defaults", ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    ("train_throughput", "process_defaults", ["--steps", "5", "--warmup", "5"],
     "--warmup must be smaller than --steps, got --warmup 5, --steps 5"),
    ("train_throughput", "process_defaults", ["--steps", "5", "--warmup", "1", "--repeats", "0"],
     "argument --repeats: must be at least 1, got 0"),
    ("train_throughput", "process_defaults", ["--accelerator", "cuda"], "no CUDA GPU"),
    ("cli_dump", "refused_fit", ["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    ("compiled_regions", "process_defaults", ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    ("compiled_regions", "process_defaults", ["--steps", "5", "--warmup", "5"],
     "--warmup must be smaller than --steps, got --warmup 5, --steps 5"),
    ("compiled_regions", "process_defaults", ["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
    ("coqe_regression_throughput", "bench_bare", ["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    ("coqe_regression_throughput", "bench_bare", ["--dims", "0"], "argument --dims: must be at least 1, got 0"),
    ("coqe_throughput", "bench_bare", ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    ("coqe_throughput", "bench_bare", ["--image-size", "-1"], "argument --image-size: must be at least 1, got -1"),
    ("ddp_stop_vote", "StopVote", ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    ("ddp_stop_vote", "StopVote", ["--host-ms", "-1"], "argument --host-ms: must be at least 0, got -1"),
    ("eigh_route", "graph_laplacian", ["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    ("h2d_copy", "_cycles_per_ms", ["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    ("host_reads", "measure", ["--pairs", "0"], "argument --pairs: must be at least 1, got 0"),
    ("host_reads", "measure", ["--val-batches", "0"], "argument --val-batches: must be at least 1, got 0"),
    ("log_overhead", "ms_per_step", ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    ("i2cl_compile", "prompts", ["--steps", "10", "--warmup", "10"],
     "--warmup must be smaller than --steps, got --warmup 10, --steps 10"),
    ("i2cl_latency", "CausalLM", ["--queries", "0"], "argument --queries: must be at least 1, got 0"),
]


def _script(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the scripts import their neighbours
    return load_script(BENCHMARKS / f"{name}.py")


def _refused(capsys, script, argv: list[str]) -> str:
    """Runs ``script.main(argv)``, which must exit 2 with a one-line ``error:`` before any work starts."""
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and ": error: " in err[-1] and "Traceback" not in "\n".join(err), err
    return err[-1]


@pytest.mark.parametrize(("name", "work", "argv", "words"), ROWS, ids=[f"{r[0]}:{' '.join(r[2][-2:])}" for r in ROWS])
def test_counts_that_measure_nothing_are_refused_in_one_line_before_any_work(capsys, monkeypatch, name, work, argv,
                                                                            words) -> None:
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is visible: --accelerator cuda is a valid choice here")
    script = _script(name)

    def ran(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(script, work, ran)
    line = _refused(capsys, script, argv)
    assert words in line, line


def test_train_throughput_refuses_a_config_that_is_not_icssl(capsys) -> None:
    """Its bare loop is IC-SSL's step: another paper's config used to end in an AttributeError after the Lightning
    run."""
    line = _refused(capsys, _script("train_throughput"), ["--config", str(ROOT / "configs/coqe/regression.yaml"),
                                                          "--steps", "3", "--warmup", "1", "--repeats", "1"])
    assert "IC-SSL" in line and "step_speed.py" in line, line

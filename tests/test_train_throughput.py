"""``benchmarks/train_throughput.py``: Lightning vs a bare loop; the arguments it refuses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def _refused(capsys, script, argv: list[str]) -> str:
    """Runs ``script.main(argv)``, which must exit 2 with a one-line ``error:`` before any work starts."""
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and ": error: " in err[-1] and "Traceback" not in "\n".join(err), err
    return err[-1]


@pytest.mark.parametrize("argv", [
    ['--steps', '0'],
    ['--steps', '5', '--warmup', '1', '--repeats', '0'],
    ['--accelerator', 'cuda'],
])
def test_counts_that_measure_nothing_are_refused_in_one_line_before_any_work(capsys, monkeypatch, argv) -> None:
    """Zero or negative counts (and a GPU option without a GPU) end with status 2 and one line, not with a
    traceback or a report of zeros after the work."""
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is visible: --accelerator cuda is a valid choice here")
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    script = load_script(BENCHMARKS / "train_throughput.py")

    def ran(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(script, "process_defaults", ran)
    line = _refused(capsys, script, argv)
    assert "must be" in line or "no CUDA GPU" in line or "need" in line, line


def test_a_config_that_is_not_icssl_is_refused_in_one_line(capsys) -> None:
    """The bare loop is IC-SSL's step: another paper's config used to end in an AttributeError after the
    Lightning run."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    script = load_script(BENCHMARKS / "train_throughput.py")
    line = _refused(capsys, script, ["--config", str(ROOT / "configs/coqe/regression.yaml"), "--steps", "3",
                                     "--warmup", "1", "--repeats", "1"])
    assert "IC-SSL" in line and "step_speed.py" in line, line

"""``benchmarks/step_speed.py --phases``: the Lightning run's stages, as ``main_command.py --phases`` gives a CLI's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MANIFOLDS = str(ROOT / "configs/icssl/manifolds.yaml")


def test_phases_give_each_stage_of_the_lightning_run_with_calls_mean_and_median(capsys) -> None:
    """Six eager steps of a tiny IC-SSL config: each stage ran once per step, and the bare loop has no phases."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # --phases imports step_trace and main_command beside it
    script = load_script(BENCHMARKS / "step_speed.py")
    tiny = ["--set=--model.init_args.net.init_args.representation.init_args.n_points=20",
            "--set=--data.init_args.n_points=20", "--set=--data.init_args.batch_size=16"]
    assert script.main(["--config", MANIFOLDS, "--device", "cpu", "--modes", "off", "--steps", "6", "--warmup",
                        "2", "--phases", "--top", "30", *tiny]) == 0
    out = capsys.readouterr().out.splitlines()
    phases = [line for line in out if line.startswith("phases")]
    assert len(phases) == 1 and phases[0].startswith("phases    mode=off              deterministic=true : ")
    stages = dict(part.split(": ", 1) for part in phases[0].split(" : ", 1)[1].split("; "))
    for stage in ("training_step", "backward", "ICSSLModule.optimizer_step", "train_dataloader_next"):
        assert stages[stage].startswith("0.") and "(6 x " in stages[stage] and "median" in stages[stage], stage
    assert any(line.startswith("bare      mode=off") for line in out)


@pytest.mark.parametrize("argv", [
    ["--repeats", "0", "--steps", "3", "--warmup", "1"],
    ["--steps", "3", "--warmup", "-1"],
    ["--device", "cuda"],
    ["--modes", "off,bogus"],
    ["--deterministic", "yes"],
    ["--paths", "lightning,fast"],
])
def test_no_repeat_a_negative_warm_up_or_a_missing_gpu_is_refused_in_one_line(capsys, monkeypatch, argv) -> None:
    """Before building anything: not a table of 0.00 steps/s, nor CUDA's traceback on a machine without a GPU."""
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda is valid here")
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    script = load_script(BENCHMARKS / "step_speed.py")

    def ran(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(script, "build", ran)
    with pytest.raises(SystemExit) as exit_:
        script.main(["--config", MANIFOLDS, *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ": error: " in err[-1] and any(s in err[-1] for s in ("must be", "no CUDA GPU", "unknown")), err

"""``benchmarks/main_command.py``: the stages it reads from a run's profiler report (``--phases``)."""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import pytest
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # main_command.py imports step_trace beside it
    return load_script(BENCHMARKS / "main_command.py"), load_script(BENCHMARKS / "step_trace.py")


def test_the_top_stages_come_by_total_time_with_short_names_calls_mean_and_median(scripts) -> None:
    """As a run's ``PhaseProfiler`` writes them; a stage whose first call compiled shows a mean far above its
    median, which is what each later call cost."""
    script, trace = scripts
    profiler = trace.PhaseProfiler()
    profiler.recorded_durations.update({
        "run_training_epoch": [1.5, 1.52],
        "[Strategy]SingleDeviceStrategy.validation_step": [2.0, 0.1, 0.09],
        "[Strategy]SingleDeviceStrategy.backward": [7.0] + [0.003] * 999,  # the first call compiles for 7 s
        "[Callback]ModelCheckpoint{'monitor': 'val/acc/label_ratio=0.25', 'mode': 'max', 'every_n_train_steps': 0, "
        "'every_n_epochs': 1, 'train_time_interval': None}.on_train_epoch_end": [0.01, 0.012],
        "[Callback]ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
        "'train_time_interval': None}.on_train_epoch_end": [0.02, 0.03],
        "[_TrainingEpochLoop].train_dataloader_next": [0.002] * 10,
    })
    report = profiler.summary()
    assert script.phase_lines(report, top=3) == [
        "backward: 10.00 s (1000 x 10.00 ms, median 3.00 ms)",
        "run_training_epoch: 3.02 s (2 x 1510.00 ms, median 1510.00 ms)",
        "validation_step: 2.19 s (3 x 730.00 ms, median 100.00 ms)",
    ]
    everything = script.phase_lines(report, top=50)
    assert len(everything) == 6
    assert everything[3] == "ModelCheckpoint(monitor=None).on_train_epoch_end: 0.05 s (2 x 25.00 ms, median 25.00 ms)"
    assert everything[4] == ("ModelCheckpoint(monitor=val/acc/label_ratio=0.25).on_train_epoch_end: 0.02 s "
                             "(2 x 11.00 ms, median 11.00 ms)")
    assert everything[5] == "train_dataloader_next: 0.02 s (10 x 2.00 ms, median 2.00 ms)"
    assert script.phase_lines("FIT phases\n", top=5) == []


@pytest.mark.slow  # 4 s: a CLI fit for the --phases report; reading the report (test_the_top_stages_...) stays default
def test_phases_record_each_garbage_collection_between_setup_and_teardown_and_always_list_them(scripts) -> None:
    """A full collection walks every object of a compiled run and lands in the mean of the stage it interrupts,
    so the report counts collections as stages of their own, and the printed lines keep them past ``top``."""
    script, trace = scripts
    profiler = trace.PhaseProfiler()
    gc.collect()  # before setup: not recorded
    profiler.setup("fit")
    try:
        with profiler.profile("run_training_batch"):
            time.sleep(0.05)
            gc.collect()  # generation 2 unless told otherwise
        gc.collect(0)
    finally:
        profiler.teardown("fit")
    gc.collect()  # after teardown: not recorded
    assert profiler._time_gc not in gc.callbacks
    full, young = profiler.recorded_durations["gc (generation 2)"], profiler.recorded_durations["gc (generation 0)"]
    assert len(full) == 1 and len(young) == 1
    assert 0 < full[0] < profiler.recorded_durations["run_training_batch"][0]
    lines = script.phase_lines(profiler.summary(), top=1)
    assert lines[0].startswith("run_training_batch: ")
    assert sorted(line.split(":")[0] for line in lines[1:]) == ["gc (generation 0)", "gc (generation 2)"]
    assert all(" (1 x " in line for line in lines[1:])


def test_a_trace_window_is_start_colon_steps_and_anything_else_is_refused(scripts, capsys) -> None:
    script, _ = scripts
    assert script._window("400:20") == (400, 20)
    for bad in ("400", "a:b", "-1:5", "10:0"):
        with pytest.raises(SystemExit) as exit_info:
            script.main([f"--trace={bad}"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--trace" in err and repr(bad) in err


def test_variants_run_each_mode_once_each_with_their_arguments_and_a_label_of_their_own(scripts) -> None:
    script, _ = scripts
    shipped, no_val = script._variant("shipped="), script._variant("no-val=--trainer.limit_val_batches=0 --x=1")
    assert shipped == ("shipped", []) and no_val == ("no-val", ["--trainer.limit_val_batches=0", "--x=1"])
    assert script.runs("reduce-overhead,off", [shipped, no_val]) == [
        ("reduce-overhead/shipped", "reduce-overhead", []),
        ("reduce-overhead/no-val", "reduce-overhead", ["--trainer.limit_val_batches=0", "--x=1"]),
        ("off/shipped", "off", []),
        ("off/no-val", "off", ["--trainer.limit_val_batches=0", "--x=1"]),
    ]
    # Without variants, one run per mode, labelled by the mode alone (as gpu_suite.py's headlines read it).
    assert script.runs("off", []) == [("off", "off", [])]


def test_a_variant_without_a_name_or_with_a_repeated_name_is_refused(scripts, capsys) -> None:
    script, _ = scripts
    for argv in (["--variant=--trainer.deterministic=false"], ["--variant=no val=--x"],
                 ["--variant=a=", "--variant=a=--x=1"]):
        with pytest.raises(SystemExit) as exit_info:
            script.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "variant" in err and "NAME" in err or "repeat" in err


def test_a_runs_warnings_are_listed_once_each_most_frequent_first_without_paths(scripts) -> None:
    """Python's warnings (with their category, or without it as Lightning prints its own) and torch's logged
    warnings, each named by its message; other output, tracebacks included, is not a warning."""
    script, _ = scripts
    fast_path = ("/venv/lib/python3.12/site-packages/torch/_inductor/cudagraph_trees.py:3040: UserWarning: Unable to "
                 "hit fast path of CUDAGraphs because outputs from a previous step still require backward.")
    output = "\n".join([
        ("/venv/lib/python3.12/site-packages/lightning/pytorch/trainer/connectors/data_connector.py:434: The "
        "'val_dataloader' does not have many workers which may be a bottleneck."),
        fast_path, "  warnings.warn(", fast_path,
        ("W1128 05:52:11.123000 1234 torch/_inductor/cudagraph_utils.py:12] [0/0] skipping cudagraphs due to "
        "mutated inputs (1 instances)"),
        'Traceback (most recent call last):', '  File "lit_icl/cli/app.py", line 3, in main',
        "Epoch 3: 100%", "lit_icl: compilation in this run: 2 graphs compiled (36.8 s)",
    ])
    assert script.warning_lines(output) == [
        ("2 x UserWarning: Unable to hit fast path of CUDAGraphs because outputs from a previous step still require "
        "backward."),
        "1 x warning: The 'val_dataloader' does not have many workers which may be a bottleneck.",
        "1 x log warning: skipping cudagraphs due to mutated inputs (1 instances)",
    ]
    assert script.warning_lines(output, limit=1)[1:] == ["and 2 more kinds"]
    assert not any("/venv" in line for line in script.warning_lines(output))
    assert script.warning_lines("Epoch 0\nlit_icl: stopped\n") == []


def test_a_python_window_that_overlaps_the_trace_window_is_refused(scripts, capsys) -> None:
    script, _ = scripts
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--trace=400:20", "--trace-python=410:5"])
    assert exit_info.value.code == 2
    assert "--trace 400:20 and --trace-python 410:5 overlap" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--seconds", "-5"], ["--skip", "-1"], ["--allowance", "0"]])
def test_a_run_of_no_time_is_refused_in_one_line_before_it_starts(scripts, capsys, monkeypatch, argv) -> None:
    """``--seconds 0`` used to train and compile for half a minute and fail; a negative one ran until killed."""
    script, _ = scripts

    def ran(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(script, "run", ran)
    with pytest.raises(SystemExit) as exit_:
        script.main(["--modes", "off", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ": error: " in err[-1] and "must be" in err[-1], err


def test_a_mode_that_is_not_a_compile_mode_is_refused_before_any_run(scripts, capsys, monkeypatch) -> None:
    """``--modes bogus`` started a CLI run that failed after seconds of start-up, with status 1."""
    script, _ = scripts

    def ran(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(script, "run", ran)
    with pytest.raises(SystemExit) as exit_:
        script.main(["--modes", "off,bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--modes off,bogus: 'bogus' is not a --compile.mode; give some of off, auto, default" in err[-1], err

"""``benchmarks/main_command.py``: the stages it reads from a run's profiler report (``--phases``)."""

from __future__ import annotations

from pathlib import Path

from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks/main_command.py"

#: Rows as Lightning's SimpleProfiler writes them (from a CPU run of configs/icssl/manifolds.yaml), in its order.
REPORT = """FIT Profiler Report

-------------------------------------------------------------------------------------------------------------
|  Action                                   	|  Mean duration (s)	|  Num calls      	|  Total time (s) 	|  Percentage %   	|
-------------------------------------------------------------------------------------------------------------
|  Total                                    	|  -              	|  1043           	|  5.1513         	|  100 %          	|
-------------------------------------------------------------------------------------------------------------
|  run_training_epoch                       	|  1.5118         	|  2              	|  3.0235         	|  58.694         	|
|  [Strategy]SingleDeviceStrategy.validation_step	|  0.73064        	|  3              	|  2.1919         	|  42.551         	|
|  run_training_batch                       	|  0.16884        	|  10             	|  1.6884         	|  32.777         	|
|  save_checkpoint                          	|  0.0058208      	|  6              	|  0.034925       	|  0.67797        	|
|  [Callback]ModelCheckpoint{'monitor': 'val/acc/label_ratio=0.25', 'mode': 'max', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}.on_train_epoch_end	|  0.011421       	|  2              	|  0.022841       	|  0.44341        	|
|  [_TrainingEpochLoop].train_dataloader_next	|  0.0018234      	|  10             	|  0.018234       	|  0.35396        	|
|  [Callback]ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}.on_train_epoch_end	|  0.012532       	|  2              	|  0.025063       	|  0.48654        	|
"""


def test_the_top_stages_come_by_total_time_with_short_names_calls_and_mean() -> None:
    script = load_script(SCRIPT)
    lines = script.phase_lines(REPORT, top=5)
    assert lines == [
        "run_training_epoch: 3.02 s (2 x 1511.80 ms)",
        "validation_step: 2.19 s (3 x 730.64 ms)",
        "run_training_batch: 1.69 s (10 x 168.84 ms)",
        "save_checkpoint: 0.03 s (6 x 5.82 ms)",
        "ModelCheckpoint(monitor=None).on_train_epoch_end: 0.03 s (2 x 12.53 ms)",
    ]
    # The total row is never a stage; the rest follow by total time.
    everything = script.phase_lines(REPORT, top=50)
    assert len(everything) == 7 and not any(line.startswith("Total") for line in everything)
    assert everything[5] == "ModelCheckpoint(monitor=val/acc/label_ratio=0.25).on_train_epoch_end: 0.02 s (2 x 11.42 ms)"
    assert everything[6] == "train_dataloader_next: 0.02 s (10 x 1.82 ms)"

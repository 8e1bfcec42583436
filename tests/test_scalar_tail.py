"""experiments/scalar_tail.py: a logged scalar's mean over a run's last steps, across resumed event files."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script
from torch.utils.tensorboard import SummaryWriter

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "scalar_tail.py"


@pytest.fixture(scope="module")
def tail():
    return load_script(SCRIPT)


def _write(run: Path, stamp: int, points: dict[int, float], tag: str = "train/loss") -> None:
    """One event file, renamed so its name carries ``stamp`` as the writing time."""
    scratch = run / f"scratch{stamp}"
    with SummaryWriter(str(scratch)) as writer:
        for step, value in points.items():
            writer.add_scalar(tag, value, step)
    (written,) = scratch.glob("events.out.tfevents.*")
    written.rename(run / f"events.out.tfevents.{stamp:010d}.host.1.0")
    scratch.rmdir()


def test_a_resumed_run_counts_each_step_once_with_the_newest_value(tail, tmp_path: Path, capsys) -> None:
    # First sitting logs steps 10-50; the resumed one restarts from a checkpoint at step 30 and logs 40-70.
    _write(tmp_path, 200, {40: 4.0, 50: 5.0, 60: 6.0, 70: 7.0})
    _write(tmp_path, 100, {10: 1.0, 20: 2.0, 30: 3.0, 40: 40.0, 50: 50.0})
    series = tail.scalar_series(tmp_path, "train/loss")
    assert series == {10: 1.0, 20: 2.0, 30: 3.0, 40: 4.0, 50: 5.0, 60: 6.0, 70: 7.0}
    assert tail.tail_mean(series, 30) == (pytest.approx((5.0 + 6.0 + 7.0) / 3), 3)  # steps 50, 60, 70
    assert tail.tail_mean(series, 1000) == (pytest.approx(4.0), 7)
    tail.main([str(tmp_path), "--last-steps", "30"])
    assert f"| {tmp_path} | 70 | 6.000 | 3 |" in capsys.readouterr().out


def test_a_folder_without_the_logs_or_the_tag_is_refused_by_name(tail, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="has no TensorBoard event files"):
        tail.scalar_series(tmp_path, "train/loss")
    _write(tmp_path, 100, {1: 1.0}, tag="val/acc")
    with pytest.raises(SystemExit, match="never logged the scalar 'train/loss'"):
        tail.scalar_series(tmp_path, "train/loss")


def test_a_tail_of_no_steps_is_refused_naming_the_option_and_value(tail, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        tail.main([str(tmp_path), "--last-steps", "0"])
    assert refused.value.code == 2
    assert "error: argument --last-steps: 0 must be at least 1" in capsys.readouterr().err

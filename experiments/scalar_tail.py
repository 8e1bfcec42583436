"""Mean of a logged scalar over each run's last steps, read from its TensorBoard event files.

    python experiments/scalar_tail.py runs/mmca_avmnist_converged/*/s[0-4] --tag train/loss --last-steps 2180

Used for the avMNIST table's training-loss column (docs/mmca_avmnist.md): 2,180 steps are the last 10 epochs of
the stand-in's 218 steps per epoch. A run resumed from a checkpoint re-logs the steps after that checkpoint in a
new event file; the newest file's value wins for such a step, so every step counts once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from runner import logged_scalars, positive_int


def scalar_series(run: Path, tag: str) -> dict[int, float]:
    """``{step: value}`` of ``tag`` over the event files in ``run`` (``runner.logged_scalars``), or a named error."""
    if not any(run.glob("events.out.tfevents.*")):
        raise SystemExit(f"{run} has no TensorBoard event files (events.out.tfevents.*)")
    series = logged_scalars(run, [tag])[tag]
    if not series:
        raise SystemExit(f"{run} never logged the scalar {tag!r}")
    return series


def tail_mean(series: dict[int, float], last_steps: int) -> tuple[float, int]:
    """Mean of the values logged in the last ``last_steps`` steps (``step > last - last_steps``), and their count."""
    end = max(series)
    values = [v for step, v in series.items() if step > end - last_steps]
    return sum(values) / len(values), len(values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders holding event files (e.g. runs/x/full/s0)")
    parser.add_argument("--tag", default="train/loss")
    parser.add_argument("--last-steps", type=positive_int, default=2180)
    args = parser.parse_args(argv)
    print(f"| run | last step | mean {args.tag}, last {args.last_steps} steps | values |\n|---|---|---|---|")
    for run in args.runs:
        series = scalar_series(run, args.tag)
        mean, count = tail_mean(series, args.last_steps)
        print(f"| {run} | {max(series)} | {mean:.3f} | {count} |")


if __name__ == "__main__":
    main()

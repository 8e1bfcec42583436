"""A user's command all-in, for a fixed wall time: steps/s with data, logging, validation and checkpoints.

    python benchmarks/main_command.py                                  # the main command, eager then compiled
    python benchmarks/main_command.py --config configs/icssl/manifolds.yaml --seconds 120 --modes off,reduce-overhead

Each mode runs ``python -m lit_icl fit --config ... --compile.mode MODE`` as a user would (a fresh process,
its own run folder in a temporary directory), stopped by ``--trainer.max_time``. The rate is read back from the
run's TensorBoard events: training steps between the first logged step after ``--skip`` seconds (start-up,
compilation and CUDA-graph recording fall before it) and the last logged step, over the wall time between
them, so validation rounds and checkpoints inside that window count. A second rate runs from the end of the
first validation round to the end of the last: whole training intervals, each with its validation and
checkpoint, after every graph (training and evaluation) is compiled; it is what a long run settles at. The
last value of every ``val/`` metric is printed too, to show the run learns. The paper's 10^5 steps at the
first rate are printed as a projection.

``--phases`` also says where the run's time went: the run records it with ``step_trace.PhaseProfiler``
(Lightning's ``SimpleProfiler``, host seconds per hook and loop stage, whose cost was within the noise of a 3 ms
step on our CPU machine), and the ``--top`` stages by total time are printed with their calls, mean and median,
e.g. training batches, validation steps, the representation metrics and checkpoint saving. The median is the
steady cost: the mean carries the first calls' compiling. A run's wall time that its steps do not explain shows up there.

``--variant NAME=ARGS`` (repeatable) runs each mode once per variant, with that variant's CLI arguments added
(space-separated; none for the config as shipped), and labels its lines ``mode=MODE/NAME``: one call then says what
each setting costs a run, e.g. validation (``no-validation=--trainer.limit_val_batches=0``), deterministic
kernels or DataLoader workers, each run against the same config as shipped.

Each run's warnings are printed once each, with how often the run gave them (``warnings:`` lines): Python's
warnings and torch's own log warnings, without their source paths. Some say why a run is slow, e.g. CUDA graph
trees' "Unable to hit fast path of CUDAGraphs", after which a captured function runs uncaptured.

``--trace START:STEPS`` profiles global steps ``START`` to ``START + STEPS - 1`` of each run with
``torch.profiler`` (``step_trace.StepTrace``) and prints, per step, the host time of the step, of its backward and
of its update, with the CUDA graph launches, kernel launches and synchronising calls made in each: whether a
captured step replays its graphs, and where the host waits. ``--trace-val ROUND`` profiles validation round
``ROUND`` the same way, per validation batch. ``--trace-dir`` keeps each run's full table and Chrome trace.
``--trace-python START:STEPS`` profiles a second window (apart from ``--trace``'s and from the traced validation
round) with every Python call recorded, and prints each stage's Python functions and ops by self host time
(``python-traced`` lines): what the host does in a step that is not a CUDA call. Recording Python slows the host
several-fold, so that window gives no rates.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import get_args

from bench_options import at_least, more_than

# step_trace.py is beside this script (its directory is on sys.path when it runs).
from step_trace import PYTHON_LABEL, phase_lines
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_icl.callbacks.compile import COMPILATION_LINE, CompileMode

ROOT = Path(__file__).resolve().parents[1]
PAPER_STEPS = 100_000
#: File name stem of the profiler report a ``--phases`` run writes (Lightning names it ``fit-<stem>.txt``).
PHASES = "phases"


class Stopped(Exception):
    """This script was asked to stop (SIGTERM, e.g. from ``timeout``) while a run was going."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def run(configs: list[str], mode: str, seconds: int, extra: list[str], out: Path,
        limit: float, phases: bool = False,
        trace: tuple[tuple[int, int] | None, int | None, Path | None] | None = None,
        python_window: tuple[int, int] | None = None) -> tuple[int | None, float, str]:
    """Run the command for ``seconds``; ``(exit status, wall seconds, its output)``.

    The status is ``None`` when the run was stopped: it outlived ``limit`` seconds, or this script got SIGTERM.
    Either way the run (in a process session of its own, with any workers it started) is killed, and what it
    logged so far stays in ``out`` to be read: a lease that ends early still gives a rate. ``phases``: the run
    writes ``step_trace.PhaseProfiler``'s report into ``out`` (read by :func:`phase_lines`). ``trace``:
    ``((start, steps) or None, validation round or None, report file or None)`` for ``step_trace.StepTrace``.
    ``python_window``: ``(start, steps)`` of a second ``StepTrace`` that records Python calls.
    """
    hms = time.strftime("%H:%M:%S", time.gmtime(seconds))
    cmd = [sys.executable, "-m", "lit_icl", "fit", *[a for c in configs for a in ("--config", c)],
           "--trainer.max_time", f"00:{hms}", "--trainer.enable_progress_bar", "false",
           "--trainer.logger.init_args.save_dir", str(out), *extra]
    cmd += ["--compile.mode", mode]  # named even when off: the CLI's default is auto (CUDA graphs on a GPU)
    if phases:
        cmd += ["--trainer.profiler", "step_trace.PhaseProfiler", "--trainer.profiler.dirpath",
                str(out), "--trainer.profiler.filename", PHASES]
    if trace is not None:
        window, val_round, path = trace
        cmd += ["--trainer.callbacks+=step_trace.StepTrace"]
        if window is None:
            cmd += ["--trainer.callbacks.start=null"]
        else:
            cmd += [f"--trainer.callbacks.start={window[0]}", f"--trainer.callbacks.steps={window[1]}"]
        if val_round is not None:
            cmd += [f"--trainer.callbacks.val_round={val_round}"]
        if path is not None:
            cmd += [f"--trainer.callbacks.path={path}"]
    if python_window is not None:  # a callback of its own; the arguments after it set its fields
        cmd += ["--trainer.callbacks+=step_trace.StepTrace", f"--trainer.callbacks.start={python_window[0]}",
                f"--trainer.callbacks.steps={python_window[1]}", "--trainer.callbacks.python=true"]
    # The run folder is a temporary one: shown as RUN_DIR, so a committed report names no path of the machine.
    print("$ python -m lit_icl " + " ".join(cmd[3:]).replace(str(out), "RUN_DIR"), flush=True)
    start = time.perf_counter()
    # benchmarks/ too: the run imports step_trace.StepTrace from there.
    path = [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    status: int | None
    try:
        output, _ = proc.communicate(timeout=limit)
        status = proc.returncode
    except (subprocess.TimeoutExpired, Stopped):
        # SIGTERM first: Lightning stops the run cleanly and its logger writes out what it holds; then SIGKILL.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        status = None
    return status, time.perf_counter() - start, output


#: A Python warning as ``warnings`` prints it, ``<path>.py:<line>: <Category>: <message>``, or as Lightning prints its
#: own, without the category.
_PY_WARNING = re.compile(r"^\S+\.py:\d+: (?:(\w*Warning): )?(.+)$")
#: A warning from torch's logging (glog style): ``W1128 05:52:11.123000 1234 torch/_inductor/x.py:12] [0/0] <message>``.
_LOG_WARNING = re.compile(r"^W\d{4} [\d:.]+ \d+ \S+\] (?:\[[^\]]*\] )?(.+)$")


def warning_lines(output: str, limit: int = 12) -> list[str]:
    """The distinct warnings in a run's output, most frequent first: ``"<count> x <Category>: <message>"``.

    Each is named by its category and first line, not by the file that raised it (a path of the machine that ran
    it); at most ``limit`` kinds, and a last line saying how many more there were."""
    counts: dict[str, int] = {}
    for line in output.splitlines():
        if (match := _PY_WARNING.match(line)) is not None:
            key = f"{match.group(1) or 'warning'}: {match.group(2).strip()}"
        elif (match := _LOG_WARNING.match(line)) is not None:
            key = f"log warning: {match.group(1).strip()}"
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])  # stable: first seen first among equals
    lines = [f"{n} x {key}" for key, n in ranked[:limit]]
    if len(ranked) > limit:
        lines.append(f"and {len(ranked) - limit} more kinds")
    return lines


def between_validations(ea: EventAccumulator) -> tuple[float, int] | None:
    """``(steps/s, validation rounds)`` from the end of the first validation round to the end of the last, or
    ``None`` with fewer than two rounds. A round's end is when its first logged ``val/`` value was written."""
    tags = sorted(tag for tag in ea.Tags()["scalars"] if tag.startswith("val/"))
    if not tags:
        return None
    rounds = ea.Scalars(tags[0])
    if len(rounds) < 2 or rounds[-1].wall_time <= rounds[0].wall_time:
        return None
    return (rounds[-1].step - rounds[0].step) / (rounds[-1].wall_time - rounds[0].wall_time), len(rounds)


def rate(run_dir: Path, skip: float) -> tuple[float, int, dict[str, float], tuple[float, int] | None]:
    """``(steps/s, last step, last val/ values, steps/s between validations)`` from a run's TensorBoard events."""
    events = sorted(run_dir.rglob("events.out.tfevents.*"))
    if not events:
        raise RuntimeError(f"no TensorBoard events under {run_dir}")
    ea = EventAccumulator(str(events[0].parent))
    ea.Reload()
    loss = ea.Scalars("train/loss")
    t_first = loss[0].wall_time
    kept = [e for e in loss if e.wall_time - t_first >= skip] or loss[-2:]
    a, b = kept[0], loss[-1]
    steps_per_s = (b.step - a.step) / (b.wall_time - a.wall_time) if b.wall_time > a.wall_time else float("nan")
    vals = {tag: ea.Scalars(tag)[-1].value for tag in ea.Tags()["scalars"] if tag.startswith("val/")}
    return steps_per_s, loss[-1].step, vals, between_validations(ea)


def _window(text: str) -> tuple[int, int]:
    """``START:STEPS`` -> ``(start, steps)``."""
    try:
        start, steps = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not START:STEPS, e.g. 300:20") from None
    if start < 0 or steps < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: START must be >= 0 and STEPS >= 1")
    return start, steps


def _variant(text: str) -> tuple[str, list[str]]:
    """``NAME=ARGS`` -> ``(NAME, [ARG, ...])``; ARGS are CLI arguments separated by spaces, and may be empty."""
    name, sep, rest = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=ARGS with a NAME of letters, digits, '-' and '_', "
            "e.g. no-validation=--trainer.limit_val_batches=0 (or shipped= for no change)")
    return name, rest.split()


def runs(modes: str, variants: list[tuple[str, list[str]]]) -> list[tuple[str, str, list[str]]]:
    """``(label, mode, extra arguments)`` of each run: every mode, once per variant (``MODE/NAME``), or once
    when no variant is named."""
    names = [name for name, _ in variants]
    if len(set(names)) < len(names):
        raise ValueError(f"variant names repeat: {names}; give each its own")
    known = get_args(CompileMode)
    if unknown := [mode for mode in modes.split(",") if mode not in known]:
        raise ValueError(f"--modes {modes}: {', '.join(map(repr, unknown))} is not a --compile.mode; give some of "
                         f"{', '.join(known)}")
    return [(mode if not variants else f"{mode}/{name}", mode, extra)
            for mode in modes.split(",") for name, extra in (variants or [("", [])])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", default=None,
                        help="a config file; repeat for overlays (default: configs/coqe_omniglot.yaml)")
    parser.add_argument("--modes", default="off,reduce-overhead", help="off and/or --compile.mode values")
    parser.add_argument("--seconds", type=at_least(1), default=120,
                        help="wall time of each run (--trainer.max_time)")
    parser.add_argument("--skip", type=at_least(0, float, " seconds"), default=30.0,
                        help="seconds after the first logged step that the rate ignores (compilation, warm-up)")
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument, e.g. --set=--trainer.log_every_n_steps=10")
    parser.add_argument("--variant", type=_variant, action="append", default=[], metavar="NAME=ARGS",
                        help="run each mode once more with these CLI arguments (space-separated; empty: as shipped) "
                             "and label it MODE/NAME, e.g. no-validation=--trainer.limit_val_batches=0; repeatable")
    parser.add_argument("--allowance", type=more_than(0, note=" seconds"), default=120.0,
                        help="seconds a run may take beyond --seconds (start-up, building a stand-in, saving) before "
                             "it is stopped and its rate so far reported; measured on one H200: about 60 s for the "
                             "main command with its glyphs built, 25 s for IC-SSL")
    parser.add_argument("--phases", action="store_true",
                        help="record where the time went (step_trace.PhaseProfiler: Lightning's SimpleProfiler with "
                             "medians) and print the top stages")
    parser.add_argument("--top", type=int, default=10, help="stages printed by --phases")
    parser.add_argument("--trace", type=_window, default=None, metavar="START:STEPS",
                        help="profile global steps START to START+STEPS-1 and print where each step's host time "
                             "goes (step_trace.py)")
    parser.add_argument("--trace-val", type=int, default=None, metavar="ROUND",
                        help="profile validation round ROUND (1: the first after the sanity check) the same way")
    parser.add_argument("--trace-python", type=_window, default=None, metavar="START:STEPS",
                        help="profile global steps START to START+STEPS-1 with every Python call recorded and print "
                             "each stage's Python functions and ops by self host time (a window apart from --trace's; "
                             "its times are slowed by the recording)")
    parser.add_argument("--trace-dir", type=Path, default=None,
                        help="keep each run's trace (table and Chrome trace) here, as trace-<mode>[-<variant>].txt/.json")
    args = parser.parse_args(argv)
    try:
        planned = runs(args.modes, args.variant)
    except ValueError as err:
        parser.error(str(err))
    if args.trace is not None and args.trace_python is not None:
        (a, n), (b, m) = args.trace, args.trace_python
        if a < b + m and b < a + n:
            parser.error(f"--trace {a}:{n} and --trace-python {b}:{m} overlap; one profiler records at a time, "
                         "so give the Python window steps of its own")
    configs = args.config or ["configs/coqe_omniglot.yaml"]
    limit = args.seconds + args.allowance
    failed = False
    signal.signal(signal.SIGTERM, _stop)
    for label, mode, extra in planned:
        with tempfile.TemporaryDirectory() as tmp:
            trace = None
            if args.trace is not None or args.trace_val is not None:
                stem = label.replace("/", "-")
                kept = args.trace_dir.resolve() / f"trace-{stem}.txt" if args.trace_dir is not None else None
                trace = (args.trace, args.trace_val, kept)
            status, wall, output = run(configs, mode, args.seconds, [*args.set, *extra], Path(tmp), limit,
                                       args.phases, trace, args.trace_python)
            tail = "\n".join(output.strip().splitlines()[-15:])
            # CompileNets' summary of what compiling cost, and whether anything compiled after the first round.
            compiled = [ln for ln in output.splitlines() if ln.startswith(COMPILATION_LINE)]
            traced = [ln.removeprefix("lit_icl trace: ") for ln in output.splitlines()
                      if ln.startswith("lit_icl trace: ")]
            report = Path(tmp) / f"fit-{PHASES}.txt"
            stages = phase_lines(report.read_text(), args.top) if report.is_file() else []
            if status is None:  # stopped: its numbers so far still count, marked as such
                print(f"mode={label}: STOPPED after {wall:.0f} s (the --allowance limit or SIGTERM); the rate below "
                      f"covers what it logged until then\n{tail}", flush=True)
                failed = True
            elif status != 0:
                print(f"mode={label}: FAILED (exit {status}) after {wall:.0f} s\n{tail}", flush=True)
                failed = True
                continue
            try:
                sps, last, vals, steady = rate(Path(tmp), args.skip)
            except (RuntimeError, KeyError) as err:
                print(f"mode={label}: no rate ({err})\n{tail}", flush=True)
                failed = True
                continue
        shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(vals.items()))
        print(f"mode={label:16s}: {sps:8.2f} steps/s all-in, {last + 1} steps in {wall:.0f} s of wall time; "
              f"10^5 steps would take {PAPER_STEPS / sps / 60:.0f} min; last validation: {shown or 'none'}",
              flush=True)
        if steady is not None:
            print(f"mode={label:16s}: {steady[0]:8.2f} steps/s between the first and last of {steady[1]} validation "
                  f"rounds (validation and checkpoints included, compilation done)", flush=True)
        if compiled:
            print(f"mode={label:16s}: {compiled[-1].removeprefix('lit_icl: ')}", flush=True)
        for line in traced:
            print(f"mode={label:16s}: trace: {line}", flush=True)
        # Messages may name the run folder or the checkout (Lightning's srun hint quotes the command): not kept.
        for line in warning_lines(output.replace(tmp, "RUN_DIR").replace(str(ROOT), ".")):
            print(f"mode={label:16s}: warnings: {line}", flush=True)
        if args.trace_python is not None and not any(line.startswith(PYTHON_LABEL) for line in traced):
            print(f"mode={label:16s}: trace: the run ended before step {args.trace_python[0]} (--trace-python)",
                  flush=True)
        traced = [line for line in traced if not line.startswith(PYTHON_LABEL)]
        if args.trace is not None and not any(not line.startswith("validation round") for line in traced):
            print(f"mode={label:16s}: trace: the run ended before step {args.trace[0]}", flush=True)
        if args.trace_val is not None and not any(line.startswith("validation round") for line in traced):
            print(f"mode={label:16s}: trace: the run ended before validation round {args.trace_val}", flush=True)
        if args.phases:
            print(f"mode={label:16s}: where the time went (host seconds, Lightning's SimpleProfiler with medians): "
                  + ("; ".join(stages) if stages else "no profiler report (the run did not finish cleanly)"),
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

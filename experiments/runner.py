"""The job runner the experiment drivers share: each job is one ``python -m lit_icl fit|test`` call.

A job's ``folder`` is its run folder; a ``done`` marker there makes a re-run of the driver skip it, and a ``fit``
whose ``last.ckpt`` exists resumes from it (``--ckpt_path last``), so a grid of runs can be stopped at any point
and restarted. Every command line is written at the top of the job's log, so any single number can be re-run by
hand. ``fit`` jobs run as subprocesses; ``test`` jobs run in forked workers that imported Lightning once.

Executors: a driver's ``--executor local`` (the default) runs its jobs here, ``--jobs`` at a time; ``--executor
slurm`` hands the same jobs to SLURM through submitit, one job array per stage (``experiments/cluster.py``). Either
way each job writes ``job.json`` (what it runs) and ``job_state.json`` (executor, SLURM job id, node, state, exit
code, log) into its run folder, and the grid's own command line goes to ``<out>/grid.json``, so a driver's
``report`` can say which jobs failed or are missing and give the command that reruns them, and note where its own
options differ from the grid's. Stage ``all`` runs
``fit``, then ``test``, then prints the report.

The ``done`` marker records the job's wall-clock and CPU seconds and the commit of the code that ran it, and this
file is also a small command over finished grids:

    python experiments/runner.py cost runs/icssl_converged              # wall and CPU time of every finished job
    python experiments/runner.py cost experiments/results/grids/icssl_converged.csv    # the same, from its table
    python experiments/runner.py tidy runs/icssl_converged experiments/results/grids/icssl_converged.csv

``tidy`` writes a grid's finished runs as one tidy CSV (``experiments/tidy.py``: a row per run and metric, with
the config values that vary, steps, CPU seconds and commit; no checkpoints, logs or machine paths); a driver's
``report --csv`` writes the same file, and its ``report --out <csv>`` regenerates its tables from it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]


#: The module a job runs: ``python -m lit_icl <argv>``.
CLI_MODULE = "lit_icl"


@dataclass
class Job:
    """One ``python -m lit_icl`` call (``argv`` after ``python -m lit_icl``); ``folder`` is its run folder, where
    ``done`` marks success; ``after`` lists the run folders whose ``done`` it waits for."""

    name: str
    argv: list[str]
    folder: Path
    after: list[Path] = field(default_factory=list)  # folders whose ``done`` this job needs

    @property
    def done(self) -> bool:
        return (self.folder / "done").is_file()

    @property
    def stage(self) -> str:
        return self.argv[0]

    def write_spec(self, threads: int) -> Path:
        """``job.json`` in the run folder: the job itself, which ``runner.py run-job FOLDER`` runs on any host."""
        self.folder.mkdir(parents=True, exist_ok=True)
        spec = {**asdict(self), "folder": str(self.folder), "after": [str(f) for f in self.after], "threads": threads}
        (self.folder / "job.json").write_text(json.dumps(spec, indent=1) + "\n")
        return self.folder / "job.json"

    @classmethod
    def read_spec(cls, folder: Path) -> tuple[Job, int]:
        """The job ``write_spec`` wrote into ``folder``, and its torch threads."""
        spec = json.loads((folder / "job.json").read_text())
        job = cls(spec["name"], spec["argv"], Path(spec["folder"]), [Path(f) for f in spec["after"]])
        return job, spec["threads"]


#: What ``job_state.json`` says of a job: handed to an executor, running, finished (``done``) or failed.
JOB_STATES = ("submitted", "running", "done", "failed")


def write_state(folder: Path, state: str, **fields: object) -> None:
    """Record a job's state in ``folder/job_state.json``, keeping what earlier states recorded (its SLURM id, the
    node, the logs) unless ``fields`` replace it; written whole, then renamed, so a reader never sees half a file."""
    assert state in JOB_STATES, state
    folder.mkdir(parents=True, exist_ok=True)
    record = {**read_state(folder), **fields, "state": state, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = folder / "job_state.json.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(folder / "job_state.json")


def read_state(folder: Path) -> dict:
    """``job_state.json`` of a run folder, or ``{}`` (a job that was never run by this runner)."""
    try:
        return json.loads((folder / "job_state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def slurm_fields() -> dict[str, object]:
    """Where this process runs, as SLURM tells it (empty outside a SLURM job): the job id as ``squeue`` shows it
    (``<array job>_<task>`` for an array task), the node and how often SLURM has requeued the job."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return {}
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    return {"executor": "slurm", "job_id": f"{array}_{task}" if array and task else env["SLURM_JOB_ID"],
            "node": env.get("SLURMD_NODENAME"), "restarts": int(env.get("SLURM_RESTART_COUNT", "0"))}


def logger_args(out: Path, name: str, version: str) -> list[str]:
    return [
        "--trainer.logger.init_args.save_dir", str(out),
        "--trainer.logger.init_args.name", name,
        "--trainer.logger.init_args.version", version,
    ]


def mean_sd(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return m, sd


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


STAGES = ("fit", "test", "all", "report")


def add_stage_arg(parser: argparse.ArgumentParser) -> None:
    """The driver's stage: ``fit``, ``test``, ``all`` (fit, then test, then the report) or ``report``."""
    parser.add_argument("stage", choices=STAGES,
                        help="fit: train the grid; test: test what it trained; all: fit, test and report in one "
                             "go (on SLURM the test array waits for the fit array); report: the tables")


def add_job_args(parser: argparse.ArgumentParser) -> None:
    """The options every driver shares for running its jobs: where (the executor), how many at a time, threads, a
    filter, dry run; ``--executor slurm`` adds the SLURM options of ``experiments/cluster.py``."""
    from cluster import add_slurm_args

    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="local: run the jobs here, --jobs at a time; slurm: submit each stage as a SLURM job "
                             "array through submitit (pip install -e '.[cluster]'), --jobs of them at a time")
    parser.add_argument("--jobs", type=positive_int, default=2, help="runs at a time (on SLURM: per job array)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per run")
    parser.add_argument("--only", nargs="+", default=[""], help="only jobs whose name contains one of these")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    add_slurm_args(parser)


def parse_driver_args(parser: argparse.ArgumentParser, argv: list[str] | None, script: str) -> argparse.Namespace:
    """``parser.parse_args(argv)``, keeping the command line (``args.script``, ``args.argv``: what ``report`` gives
    as the command that reruns a grid's unfinished jobs). ``run_stage`` calls ``args.check_executor()`` before
    anything runs, which refuses an executor that cannot run here (``report`` needs none)."""
    from cluster import check_slurm_args

    def one_line(message: str) -> NoReturn:  # the project's refusal: one line, status 2 (not argparse's usage too)
        _refuse(f"{parser.prog}: error: {message}")

    parser.error = one_line  # type: ignore[method-assign]  # also for the driver's own checks after parsing
    args = parser.parse_args(argv)
    seeds = getattr(args, "seeds", None)
    if seeds is not None and (len(set(seeds)) != len(seeds) or min(seeds, default=0) < 0):
        parser.error(f"--seeds {' '.join(map(str, seeds))}: give each seed once, as an integer >= 0 (a seed's runs "
                     "share one folder)")
    out = getattr(args, "out", None)
    if args.stage != "report" and out is not None and Path(out).exists() and not Path(out).is_dir():
        parser.error(f"--out {out} is a file; {args.stage} writes the grid's run folders into a folder: name another")
    args.script = Path(script).resolve()
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.check_executor = lambda: check_slurm_args(parser, args) if args.executor == "slurm" else None
    return args


def add_convergence_args(parser: argparse.ArgumentParser, patience: int | None = None) -> None:
    """``--patience`` / ``--val-every`` / ``--min-delta``: the shared early-stopping rule of a step-based driver
    (``patience=None``: off unless given, the run trains its fixed length)."""
    parser.add_argument("--patience", type=int, default=patience,
                        help="train to convergence: stop after this many validation rounds without improvement "
                             "(the shared early-stopping rule); --steps becomes the cap")
    parser.add_argument("--val-every", type=int, default=100, help="steps between validation rounds (--patience)")
    parser.add_argument("--min-delta", type=float, default=0.001,
                        help="the smallest rise of the monitored accuracy that counts as an improvement (--patience)")
    parser.add_argument("--min-steps", type=positive_int, default=None,
                        help="train at least this many steps before the early-stopping rule may end a run (--patience; "
                             "capped at each run's own step cap), for runs whose validation score dips after their first "
                             "round and recovers later, which a short patience would stop inside the dip")


def positive_int(value: str) -> int:
    """An integer >= 1 (an argparse ``type``: anything else is refused by name)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} must be at least 1")
    return number


_UNSET = object()


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The options (their ``dest``) that ``argv`` gives explicitly rather than leaving at their defaults.

    argparse fills in a default only for an option the namespace does not hold yet, so a namespace holding a marker
    for every option keeps the marker exactly where the command line is silent."""
    probe = argparse.Namespace(**{a.dest: _UNSET for a in parser._actions if a.dest != argparse.SUPPRESS})
    parser.parse_args(argv, namespace=probe)
    return {dest for dest, value in vars(probe).items() if value is not _UNSET}


def tested_cells(args: argparse.Namespace, parser: argparse.ArgumentParser, records: dict[str, Any],
                 test_run: re.Pattern[str], order: dict[str, list[Any]] | None = None) -> argparse.Namespace:
    """``args`` with the grid cells a report reads: each option the command line gave as given, every other one
    (named by a group of ``test_run``, the pattern of a test run's name) set to the values with a finished test, so
    that a report without the grid's options reports the grid rather than the options' defaults, of which it may
    have no run. A group's values are sorted by ``order[group]`` when given, else as integers. ``args`` without
    ``argv`` (built in Python) name every cell themselves and are returned as they are."""
    argv = getattr(args, "argv", None)
    if argv is None:
        return args
    given = given_options(parser, argv)
    tested = [m for run, record in records.items() if (m := test_run.match(run)) and record.results is not None]
    cells = copy.copy(args)
    for group in test_run.groupindex:
        option = f"{group}s"  # groups are named after their option: seed -> --seeds
        if option in given or not tested:
            continue
        if order and group in order:
            setattr(cells, option, sorted({m[group] for m in tested}, key=order[group].index))
        else:
            setattr(cells, option, sorted({int(m[group]) for m in tested}))
    return cells


def chosen_seeds(have: Iterable[int], asked: list[int], given: bool) -> tuple[list[int], str]:
    """The seeds a report reads and how its header names them.

    ``have``: the seeds with a finished run. Without ``--seeds`` (``given`` false) a report reads them all, whatever
    the default of ``--seeds`` is, so a table regenerated from a CSV holds every seed of it. With ``--seeds`` it
    reads those of them that have runs, and the header says which seeds it left out and which asked-for seeds have
    no run (rather than listing a seed that contributes nothing)."""
    have = sorted(set(have))
    if not given:
        return have, f"seeds {have}"
    seeds = [s for s in asked if s in have]
    notes = []
    if left_out := [s for s in have if s not in seeds]:
        notes.append(f"chosen with --seeds; the runs also have {_plural('seed', left_out)}")
    if missing := [s for s in asked if s not in have]:
        notes.append(f"{_plural('seed', missing)}, asked for with --seeds, {'has' if len(missing) == 1 else 'have'} "
                     "no finished run")
    return seeds, f"seeds {seeds}" + (f" ({'; '.join(notes)})" if notes else "")


def _plural(word: str, values: list[Any]) -> str:
    return f"{word}{'' if len(values) == 1 else 's'} {', '.join(map(str, values))}"


def ran_values(values: Iterable[Any]) -> str:
    """What several runs did, as one value or ``a or b`` when they did not all do the same (``""``: none known)."""
    found = sorted({v for v in values if v is not None}, key=lambda v: (isinstance(v, str), v))
    return " or ".join(map(str, found))


def unused_options_note(args: argparse.Namespace, given: set[str], ran: dict[str, str], stopped_early: bool) -> str:
    """The sentence a report's header adds for the options given to ``report`` (``given``) that the runs did not
    use, ``""`` when there are none: the numbers are the runs' as they ran (``ran``: what they did, by option, as
    :func:`ran_values` writes it), whatever the report was told."""
    if "patience" in given and not stopped_early:
        ran = {**ran, "patience": "none (fixed length)"}
    differ = [f"--{key.replace('_', '-')} {getattr(args, key)} (the runs: {ran[key]})" for key in ran
              if key in given and ran[key] and str(getattr(args, key)) not in ran[key].split(" or ")]
    if not differ:
        return ""
    return (" This report was given " + ", ".join(differ) + ", which the runs did not use; the tables are the runs' "
            "as they ran.")


def check_convergence_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``parser.error``: one line, exit 2, before anything is written) early-stopping options that cannot
    mean what they say (the options of :func:`add_convergence_args`).

    ``--val-every 0`` divides by zero; the rest is :func:`check_early_stopping_args` in steps and validation rounds,
    with ``--min-steps`` a floor under the early-stopping rule and ``--val-every`` its rounds' interval (a fixed-length
    run validates once an epoch, ``--epochs``)."""
    if args.val_every < 1:
        parser.error(f"--val-every {args.val_every}: validate every 1 or more steps (default 100)")
    check_early_stopping_args(parser, args, rounds="validation rounds without improvement", rise="rise",
                              length="--steps", needs_patience={"min_steps": "is a floor under early stopping"},
                              given_needs_patience={"val_every": "is the interval of early stopping's validation rounds"})


def check_early_stopping_args(parser: argparse.ArgumentParser, args: argparse.Namespace, *, rounds: str, rise: str,
                              length: str, needs_patience: dict[str, str],
                              given_needs_patience: dict[str, str] | None = None) -> None:
    """Refuse (``parser.error``) ``--patience`` / ``--min-delta`` values that cannot mean what they say, in a
    driver's own units: ``rounds``, what ``--patience`` counts (e.g. ``"epochs without a rise of val/acc"``);
    ``rise``, what ``--min-delta`` measures; ``length``, the option a run without ``--patience`` trains all of.

    ``--patience 0`` would stop a run at its first round; a negative ``--min-delta`` counts a fall as an
    improvement; the options in ``needs_patience`` (dest, default ``None``: what the option does) and ``--min-delta``
    only act through the early-stopping rule, so without ``--patience`` (fixed-length runs, which train all their
    ``length`` anyway) they would be silently ignored. ``--min-delta`` and the options in ``given_needs_patience``
    (dest: what the option does) have defaults, so only the command line (``args.argv``) tells whether they were
    given."""
    if args.patience is not None and args.patience < 1:
        parser.error(f"--patience {args.patience}: give 1 or more {rounds} before a run stops (or drop --patience to "
                     f"train each run its fixed {length})")
    if args.min_delta < 0:
        parser.error(f"--min-delta {args.min_delta}: the smallest {rise} that counts as an improvement is 0 or more "
                     f"(default {parser.get_default('min_delta')})")
    if args.patience is not None:
        return
    given = {dest for dest in needs_patience if getattr(args, dest) is not None}
    defaulted = {"min_delta": "is the smallest rise early stopping counts", **(given_needs_patience or {})}
    given |= given_options(parser, getattr(args, "argv", [])) & defaulted.keys()
    for dest, what in {**needs_patience, **defaulted}.items():
        if dest in given:
            option = "--" + dest.replace("_", "-")
            parser.error(f"{option} {getattr(args, dest)} {what}, which only --patience turns on (a fixed-length run "
                         f"trains all its {length}); add --patience P or drop {option}")


def config_file(value: str) -> Path:
    """An existing YAML config file holding a mapping, resolved (an argparse ``type``: anything else is refused by
    name before a job starts, where it would fail every run; :func:`lit_icl.core.configfiles.check_config_file`)."""
    from lit_icl.core.configfiles import check_config_file
    from lit_icl.core.errors import ConfigError

    path = Path(value).resolve()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such config file: {path} (an overlay sits beside its base config, "
                                         "in configs/<paper>/<experiment>/)")
    try:
        check_config_file(str(path))
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--config ")) from None
    return path


def add_overlay_arg(parser: argparse.ArgumentParser, base: str, example: str) -> None:
    """``--overlay FILE...``: config overlays stacked after a driver's own config in every run it trains."""
    parser.add_argument("--overlay", type=config_file, nargs="+", default=[],
                        help=f"config overlays added to every run after {base}, e.g. {example}; use an --out of "
                             "their own")


def overlay_argv(paths: list[Path]) -> list[str]:
    """``--config`` arguments for the overlays, in order (later ones win)."""
    return [arg for path in paths for arg in ("--config", str(path))]


def best_checkpoint(run: Path) -> Path | None:
    """The run's ``checkpoints/best-{epoch}-{step}.ckpt`` (the monitored checkpoint the drivers add), or ``None``.

    One file normally; a fit resumed in another folder (a run folder copied, or moved between machines) starts a
    fresh top-1 record there and leaves the earlier sitting's file, so the one with the highest step wins: the
    later sitting's best. By number, not by name: ``best-epoch=72`` sorts after ``best-epoch=259`` as text.
    """
    def step(path: Path) -> int:
        found = re.search(r"step=(\d+)", path.name)
        return int(found.group(1)) if found else -1

    return max((run / "checkpoints").glob("best-*.ckpt"), key=step, default=None)


def logged_scalars(run: Path, tags: Iterable[str]) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` over every TensorBoard event file directly in ``run``.

    Files are read in the order of the time in their names (``events.out.tfevents.<time>.<host>...``); a fit
    resumed from a checkpoint re-logs the steps after it in a new file, whose values then win, so every step
    counts once. A tag the run never logged maps to ``{}``.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def written_at(path: Path) -> tuple[int, str]:
        parts = path.name.split(".")
        return (int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0), path.name

    out: dict[str, dict[int, float]] = {tag: {} for tag in tags}
    for path in sorted(run.glob("events.out.tfevents.*"), key=written_at):
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})  # 0: keep every point
        events.Reload()
        for tag in out.keys() & set(events.Tags()["scalars"]):
            out[tag].update({e.step: float(e.value) for e in events.Scalars(tag)})
    return out


def run_stage(args: argparse.Namespace, fit_jobs: Callable[[argparse.Namespace], list[Job]],
              test_jobs: Callable[[argparse.Namespace], list[Job]],
              report: Callable[[argparse.Namespace], str] | None = None) -> NoReturn:
    """Run a driver's ``fit``, ``test`` or ``all`` stage (``args.stage``) on its executor and exit 1 if any job
    failed or is missing. ``all`` runs the fits, then the tests (built once the fits have finished, since a test
    may read its fit's checkpoints), then prints ``report(args)``."""
    args.check_executor()
    check_only(args, fit_jobs, test_jobs)
    try:
        if args.executor == "slurm":
            from cluster import run_stage_on_slurm

            sys.exit(1 if run_stage_on_slurm(args, fit_jobs, test_jobs, report) else 0)  # not a count: 2 is a refusal
        if not args.dry_run:
            claim_grid(args)
            record_grid(args)
        failed = 0
        if args.stage in ("fit", "all"):
            failed += run_all(select(fit_jobs(args), args.only), args, "fit")
        if args.stage in ("test", "all"):
            failed += run_all(select(test_jobs(args), args.only), args, "test")
        if args.stage == "test" and not args.dry_run:  # tests left waiting for their fits did not finish either,
            failed = print_unfinished(select(test_jobs(args), args.only), args)  # as on SLURM
        if args.stage == "all" and not args.dry_run:
            failed = finish_all(args, fit_jobs, test_jobs, report)
        sys.exit(1 if failed else 0)
    finally:
        release_grid()


def check_only(args: argparse.Namespace, fit_jobs: Callable[[argparse.Namespace], list[Job]],
               test_jobs: Callable[[argparse.Namespace], list[Job]]) -> None:
    """Refuse (exit 2, before anything is written) an ``--only`` that names no job of the grid: a typo would
    otherwise run nothing and exit 0, and replace the grid's record."""
    if args.only == [""]:
        return
    names = [job.name for job in fit_jobs(args) + test_jobs(args)]
    unmatched = [part for part in args.only if not any(part in name for name in names)]
    if unmatched:
        _refuse(f"{Path(args.script).name}: error: --only {' '.join(map(repr, unmatched))} matches none of the grid's "
                f"{len(names)} jobs (e.g. {names[0] if names else 'none'!r}); a job is run when its name contains one "
                "of --only")


def drive(args: argparse.Namespace, fit_jobs: Callable[[argparse.Namespace], list[Job]],
          test_jobs: Callable[[argparse.Namespace], list[Job]], report: Callable[[argparse.Namespace], Any],
          parse_args: Callable[[list[str]], argparse.Namespace]) -> None:
    """A driver's ``main``: ``report`` prints the tables (and, on stderr, the jobs of the grid that did not finish,
    with the command that reruns them); ``fit``, ``test`` and ``all`` run on the chosen executor."""
    refuse_other_drivers_grid(args)
    if args.stage in ("fit", "test", "all"):
        refuse_changed_grid(args, parse_args, fit_jobs, test_jobs)
    if args.stage == "test":
        note_grid_difference(args, parse_args, fit_jobs)
    if args.stage != "report":
        run_stage(args, fit_jobs, test_jobs, report)
    if not args.out.exists():
        _refuse(f"{Path(args.script).name}: error: --out {args.out}: no such grid folder or results CSV; name the "
                "folder a fit, test or all stage wrote (or its report --csv file)")

    def unfinished_of_grid() -> None:
        ran = grid_of(args.out, parse_args)
        if isinstance(ran, str):
            print(f"the unfinished jobs of the grid cannot be listed: its command in {args.out / 'grid.json'} no "
                  f"longer parses ({ran})", file=sys.stderr, flush=True)
        elif ran is not None:
            print_unfinished(select(fit_jobs(ran), ran.only) + select(test_jobs(ran), ran.only), ran)

    note_grid_difference(args, parse_args)
    try:
        code = report(args)
    except SystemExit:  # a report with nothing to show (every job failed, say): still list what failed, and why
        unfinished_of_grid()
        raise
    _print_report(code)
    unfinished_of_grid()
    if isinstance(code, int) and code:  # a report that prints itself returns its exit code
        sys.exit(code)


#: Options that say how and where a grid runs or what a report writes, not which runs it has: left out of the
#: comparison of a command with the grid's own (:func:`note_grid_difference`).
NOT_GRID_SETTINGS = {"stage", "out", "script", "argv", "check_executor", "executor", "jobs", "threads", "only",
                     "dry_run", "partition", "gpus_per_job", "cpus_per_job", "mem_gb", "time_min", "sbatch",
                     "max_requeues", "no_wait", "poll_s", "from_stage", "csv", "md", "fig", "sweep_out",
                     "grid_claimed", "sbatch_options"}


#: Drivers' options that choose which cells of a grid run (each cell in run folders of its own) without changing
#: how any run trains: a grid may be run in parts by them.
GRID_CELLS = {"seeds", "arms", "models", "recipes", "sizes"}


def grid_of(out: Path, parse_args: Callable[[list[str]], argparse.Namespace],
            record: str = "argv") -> argparse.Namespace | str | None:
    """The settings of the grid recorded in ``<out>/grid.json`` (its command line, parsed by the driver), ``None``
    when there is no record, or why the record no longer parses (an overlay it names was moved, say).

    ``record="fit_argv"``: the command of the grid's fits alone, without the options of a later ``test`` stage
    (the whole record where it holds none)."""
    try:
        grid = json.loads((out / "grid.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    problem = io.StringIO()
    try:
        with contextlib.redirect_stderr(problem):
            ran = parse_args(grid.get(record, grid["argv"]))
    except SystemExit:
        lines = problem.getvalue().strip().splitlines()
        return lines[-1] if lines else "it does not parse"
    ran.out = out  # the grid as it was run, wherever its folder is now
    return ran


def _fit_cells(jobs: list[Job]) -> set[tuple[Path, tuple[str, ...]]]:
    """What a list of fits trains: each run folder with its command line."""
    return {(job.folder, tuple(job.argv)) for job in jobs}


def settings_made(out: Path, parse_args: Callable[[list[str]], argparse.Namespace],
                  fit_jobs: Callable[[argparse.Namespace], list[Job]]) -> argparse.Namespace | str | None:
    """The settings the grid's runs were made with, as :func:`grid_of` gives them (``None`` or a string when there
    are none to read), with one correction.

    A ``test`` stage adds its options to the record after the fits' (:func:`record_grid`), so one that was given
    another value of an option that changes what the fits train (``--steps``, an ``--overlay`` naming the CPU for
    a grid trained on a GPU) replaced the fits' value there, though it trained nothing: the fits ran with theirs.
    Such an option keeps the fits' value (``fit_argv``); an option that only changes the tests keeps the test's."""
    ran = grid_of(out, parse_args)
    fitted = grid_of(out, parse_args, "fit_argv")
    if not isinstance(ran, argparse.Namespace) or not isinstance(fitted, argparse.Namespace):
        return ran
    made = copy.copy(ran)
    trained = _fit_cells(fit_jobs(fitted))
    for key in _settings_differ(ran, fitted, GRID_CELLS):
        probe = copy.copy(fitted)
        setattr(probe, key, getattr(ran, key))
        if _fit_cells(fit_jobs(probe)) != trained:  # the test's value would train other runs: the fits' holds
            setattr(made, key, getattr(fitted, key))
    return made


def note_grid_difference(args: argparse.Namespace, parse_args: Callable[[list[str]], argparse.Namespace],
                         fit_jobs: Callable[[argparse.Namespace], list[Job]] | None = None) -> None:
    """Say on stderr, with both, where this command's settings differ from those of the command that ran the grid
    (``<out>/grid.json``), when that matters: for ``report``, which reads the runs with its own options (they name
    what the tables hold and the header says), any difference; for ``test`` (``fit_jobs`` given), one that makes it
    expect other fits than the grid's, whose tests would wait for fits that never ran. (A grid run in parts, a seed
    at a time, differs from its last part in the seeds: that is expected.)"""
    ran = grid_of(args.out, parse_args) if fit_jobs is None else settings_made(args.out, parse_args, fit_jobs)
    if not isinstance(ran, argparse.Namespace):
        return
    if fit_jobs is not None and _fit_cells(fit_jobs(args)) == _fit_cells(fit_jobs(ran)):
        return
    differ = _settings_differ(args, ran)
    if not differ:
        return
    print(f"note: this {args.stage} takes {_shown(args, differ)}; the grid's own command ({args.out / 'grid.json'}) "
          f"took {_shown(ran, differ)}; give {args.stage} the grid's options to {args.stage} the grid as it ran",
          file=sys.stderr, flush=True)


def _settings_differ(args: argparse.Namespace, ran: argparse.Namespace, also: set[str] = frozenset()) -> list[str]:
    """The grid settings (not :data:`NOT_GRID_SETTINGS`, nor ``also``) in which two parsed commands differ."""
    return sorted(k for k in vars(args).keys() & vars(ran).keys()
                  if k not in NOT_GRID_SETTINGS | also and getattr(args, k) != getattr(ran, k))


def _shown(namespace: argparse.Namespace, keys: list[str]) -> str:
    def value(v: Any) -> str:
        return " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return " ".join(f"--{k.replace('_', '-')} {value(getattr(namespace, k))}" for k in keys)


def refuse_changed_grid(args: argparse.Namespace, parse_args: Callable[[list[str]], argparse.Namespace],
                        fit_jobs: Callable[[argparse.Namespace], list[Job]],
                        test_jobs: Callable[[argparse.Namespace], list[Job]] = lambda args: []) -> None:
    """Refuse (one line, exit 2, nothing written) a stage into a folder whose grid has runs made with other
    settings than this command's: a run that is finished, or a fit with a ``last.ckpt`` to resume, that this
    command would run with another command line (a ``test`` stage: a finished test).

    A finished run is never run again and an interrupted one resumes, so a rerun with another ``--steps`` (say)
    reported the old runs under the new command's record, and a seed added with it was averaged with the old seeds
    in one cell. What a run was made with is its own ``job.json`` (the command line it ran, :meth:`Job.write_spec`;
    in a run folder that has since moved, or one written before runs recorded it, the command the grid's record
    ``grid.json`` gives it, :func:`settings_made`). The options that only choose cells may differ (:data:`GRID_CELLS`:
    a grid run in parts, a seed or an arm at a time), and so may how and where it runs (:data:`NOT_GRID_SETTINGS`),
    or a setting that changes no run that has got anywhere: the data of a fit that failed before its first
    checkpoint (which starts afresh), fixed after the rest of the grid had finished. A ``test`` stage may test the
    grid's fits with another fit setting (an ``--overlay`` naming the CPU for a grid trained on a GPU):
    :func:`note_grid_difference` names it."""
    ran = settings_made(args.out, parse_args, fit_jobs)
    jobs = (lambda a: test_jobs(a)) if args.stage == "test" else (lambda a: fit_jobs(a) + test_jobs(a))
    this, made = copy.copy(args), {}
    if isinstance(ran, argparse.Namespace):
        # Both commands over the cells of both (a seed added with other settings sits beside the grid's seeds).
        grid = copy.copy(ran)
        for cell in GRID_CELLS & vars(ran).keys() & vars(args).keys():
            if isinstance(getattr(ran, cell), list) and isinstance(getattr(args, cell), list):
                both = list(dict.fromkeys([*getattr(ran, cell), *getattr(args, cell)]))
                setattr(grid, cell, both)
                setattr(this, cell, both)
        made = {job.folder: job.argv for job in jobs(grid)}

    def progressed(job: Job) -> bool:  # would be skipped (done) or resumed, not started afresh
        return job.done or (job.stage == "fit" and (job.folder / "checkpoints" / "last.ckpt").is_file())

    for job in jobs(this):
        before = _recorded_argv(job) or made.get(job.folder)
        if before is None or before == job.argv or not progressed(job):
            continue
        prog = Path(args.script).name
        differ = _settings_differ(args, ran, GRID_CELLS) if isinstance(ran, argparse.Namespace) else []
        if differ:
            _refuse(f"{prog}: error: this {args.stage} takes {_shown(args, differ)}, but the grid in {args.out} has "
                    f"runs made with {_shown(ran, differ)} ({args.out / 'grid.json'}); its finished runs would not be "
                    "run again and a report would mix both: give the grid's options, or give the new settings an "
                    "--out of their own")
        options = [word for word in job.argv if word.startswith("--") and word not in before]
        options += [word for word in before if word.startswith("--") and word not in job.argv]
        _refuse(f"{prog}: error: this {args.stage} would run {job.name} with another command line than its "
                f"{'finished run' if job.done else 'last.ckpt'} in {job.folder} ran with (see its job.json"
                + (f"; they differ in {', '.join(options)}" if options else "") + "), and a finished run is not run "
                "again: give the options that run was made with, or give the new settings an --out of their own")


def _recorded_argv(job: Job) -> list[str] | None:
    """The command line ``job``'s run folder ran (its ``job.json``), or ``None`` when it recorded none or the folder
    has moved since (its paths then name the old place)."""
    try:
        spec = json.loads((job.folder / "job.json").read_text())
    except (OSError, ValueError):
        return None
    return spec.get("argv") if isinstance(spec, dict) and spec.get("folder") == str(job.folder) else None


def _stage_index(argv: list[str], stages: tuple[str, ...] = STAGES) -> int | None:
    """Where a driver command line names its stage (the first of ``stages`` among its words), or ``None``."""
    return next((i for i, word in enumerate(argv) if word in stages), None)


def _without_stage(argv: list[str]) -> list[str]:
    """A driver command line without its stage word."""
    i = _stage_index(argv)
    return list(argv) if i is None else [*argv[:i], *argv[i + 1:]]


def _test_after_fit(fit_argv: list[str], test_argv: list[str]) -> list[str]:
    """A ``test`` command line that keeps a ``fit``'s options under its own: the stage word first (after an option
    of several values, ``--only a``, it would be read as one of them), then each command's driver options, then,
    after ``--``, the options both pass through to every run (a driver's ``-- <CLI overrides>``)."""
    def split(argv: list[str]) -> tuple[list[str], list[str] | None]:
        if "--" not in argv:
            return _without_stage(argv), None
        i = argv.index("--")
        return _without_stage(argv[:i]), argv[i + 1:]

    (fit_own, fit_through), (test_own, test_through) = split(fit_argv), split(test_argv)
    through = None if fit_through is None and test_through is None else [*(fit_through or []), *(test_through or [])]
    return ["test", *fit_own, *test_own, *([] if through is None else ["--", *through])]


def refuse_empty_report(args: argparse.Namespace, what: str = "tested runs") -> str:
    """Every driver's ``report`` of a grid with no table to show: one ``error:`` line naming the folder and what to
    run, status 2 (``drive`` then lists the grid's jobs that did not finish, and why). A ``report --csv`` has
    written the tidy CSV of the runs there are (fits without tests too), which is what it was asked for: then a
    note says there are no tables, and the report is empty (``""``)."""
    if getattr(args, "csv", None) is not None:
        print(f"note: no {what} under {args.out}, so no tables; {args.csv} holds the rows of the runs there are",
              file=sys.stderr, flush=True)
        return ""
    _refuse(f"{Path(args.script).name}: error: no {what} under {args.out}; start them with `all` (or `fit`, then "
            "`test`) first")


def _print_report(text: Any) -> None:
    """A report function returns its tables, or prints them itself and returns ``None``/an exit code."""
    if isinstance(text, str) and text:
        print(text, flush=True)


def finish_all(args: argparse.Namespace, fit_jobs: Callable[[argparse.Namespace], list[Job]],
               test_jobs: Callable[[argparse.Namespace], list[Job]],
               report: Callable[[argparse.Namespace], str] | None) -> int:
    """After stage ``all``: the report on stdout, the jobs that did not finish on stderr; their number."""
    jobs = select(fit_jobs(args), args.only) + select(test_jobs(args), args.only)
    if report is not None:
        try:
            _print_report(report(args))
        except SystemExit as stop:  # nothing to report (every job failed, say): still list what failed, and why
            failed = print_unfinished(jobs, args)
            if not failed:  # every job finished, yet nothing to show: the report's refusal stands
                raise
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr, flush=True)
            return failed  # status 1, as for any stage whose jobs did not finish (2 is a refusal)
    return print_unfinished(jobs, args)


def print_unfinished(jobs: list[Job], args: argparse.Namespace) -> int:
    """Print :func:`unfinished`'s lines on stderr (nothing when every job finished); the number not done."""
    lines = unfinished(jobs, args)
    if lines:
        print("\n".join(lines), file=sys.stderr, flush=True)
    return sum(not job.done for job in jobs)


#: The grid folder's lock file, open and locked while this driver runs a stage of its grid (:func:`claim_grid`).
_GRID_LOCK: list[Any] = []


def claim_grid(args: argparse.Namespace) -> None:
    """Refuse (one line on stderr, exit 2, before anything of the grid is written) to run a grid into ``args.out``
    while it is running already, or into the folder of another driver's grid; else lock ``<out>/grid.lock`` for
    this driver.

    A grid is running when jobs that write into ``args.out`` are still in SLURM's queue (a driver stopped while it
    waited leaves them there: a second submission would start each of them again beside the first, both writing
    one run folder), or when another driver holds the folder's lock (a second driver would run the same jobs
    twice). A driver's ``report`` reads the runs under its folder, so a folder holding another driver's grid
    (``grid.json``) would mix two grids in both reports. :func:`run_stage` unlocks it when the stage ends."""
    import fcntl

    from cluster import queued_in_folder

    prog = Path(args.script).name
    queued = queued_in_folder(args.out)
    if queued:
        ids = sorted(queued)
        shown = ", ".join(f"{i} {queued[i].lower()}" for i in ids[:4]) + (", ..." if len(ids) > 4 else "")
        arrays = " ".join(sorted({i.split("_")[0] for i in ids}))
        _refuse(f"{prog}: error: {len(ids)} SLURM job{'s' if len(ids) > 1 else ''} of the grid in {args.out} "
                f"{'are' if len(ids) > 1 else 'is'} still in the queue ({shown}); running the grid again now would "
                "start them a second time beside the first: wait for them to end (`report` reads the grid any time), "
                f"or cancel them (scancel {arrays}), then rerun")
    refuse_other_drivers_grid(args)
    args.out.mkdir(parents=True, exist_ok=True)
    lock = open(args.out / "grid.lock", "a+")  # noqa: SIM115 - held open until the driver exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        _refuse(f"{prog}: error: another driver is running the grid in {args.out} now ({holder}); running it "
                "beside it would run its jobs twice: wait for it to end or stop it, or give this one another --out")
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {os.uname().nodename}: {Path(args.script).name} {shlex.join(args.argv)}\n")
    lock.flush()
    _GRID_LOCK.append(lock)
    args.grid_claimed = True  # the checks have passed: a driver may write what its jobs read (fit_jobs)


def _grid_script(out: Path) -> str | None:
    """The file name of the driver whose grid ``out`` holds (its ``grid.json``), or ``None`` when it holds none."""
    try:
        return Path(json.loads((out / "grid.json").read_text())["script"]).name
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, KeyError, TypeError):
        return None


def refuse_other_drivers_grid(args: argparse.Namespace) -> None:
    """Refuse (one line, exit 2, nothing written) any stage of this driver, a dry run or a report included, on a
    folder that holds another driver's grid (its ``grid.json`` names that driver).

    A stage would add this driver's runs to the other grid, and the reports of both read every run under the
    folder. A report of another driver's grid printed this driver's tables with every cell empty, and said that
    the grid's command "no longer parses", rather than that it is another driver's."""
    prog, other = Path(args.script).name, _grid_script(args.out)
    if other is None or other == prog:
        return
    if args.stage == "report":
        _refuse(f"{prog}: error: --out {args.out} holds the grid of {other} (its grid.json), whose runs this "
                f"driver's report does not read: report it with `python experiments/{other} report --out {args.out}`")
    _refuse(f"{prog}: error: --out {args.out} holds the grid of {other} (its grid.json), and a report reads "
            "every run under its folder: give this driver an --out of its own")


def release_grid() -> None:
    """Unlock the grid folder that :func:`claim_grid` locked (the end of a stage)."""
    while _GRID_LOCK:
        _GRID_LOCK.pop().close()


def _refuse(line: str) -> NoReturn:
    print(line, file=sys.stderr, flush=True)
    sys.exit(2)


def record_grid(args: argparse.Namespace) -> None:
    """``<out>/grid.json``: the driver command that runs this grid, which ``report`` compares its own options with
    and gives to rerun what is missing (finished jobs are skipped, interrupted fits resume). A ``test`` stage adds
    its options after those of the grid's ``fit`` (kept as ``fit_argv``), so the record holds both."""
    args.out.mkdir(parents=True, exist_ok=True)
    record, fit_argv = args.out / "grid.json", list(args.argv)
    testing = getattr(args, "stage", None) == "test"
    if testing:
        try:
            old = json.loads(record.read_text())
            fit_argv = old.get("fit_argv", old["argv"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            fit_argv = []
    argv = _test_after_fit(fit_argv, args.argv) if testing else fit_argv
    record.write_text(json.dumps({"cwd": os.getcwd(), "script": str(args.script), "argv": argv,
                                  "fit_argv": fit_argv}, indent=1) + "\n")


def rerun_command(out: Path) -> str | None:
    """The command ``record_grid`` kept for the grid under ``out``, with stage ``all``, as one shell line."""
    try:
        grid = json.loads((out / "grid.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    argv = list(grid["argv"])
    stage = _stage_index(argv, STAGES[:3])
    if stage is not None:
        argv[stage] = "all"
    cwd, script = Path(grid["cwd"]), Path(grid["script"])
    # A grid folder moved (or copied) since it ran: its command names the old folder, which the rerun would fill
    # instead; it names this one.
    given = [i for i, word in enumerate(argv[:-1]) if word == "--out"]
    if given and (cwd / argv[given[-1] + 1]).resolve() != out.resolve():
        for i in given:
            argv[i + 1] = str(out.resolve())
    script = script.relative_to(cwd) if script.is_relative_to(cwd) else script
    line = " ".join(shlex.quote(a) for a in ["python", str(script), *argv])
    return line if cwd == Path.cwd() else f"cd {shlex.quote(str(cwd))} && {line}"


def unfinished(jobs: list[Job], args: argparse.Namespace) -> list[str]:
    """Lines naming each job without a ``done`` marker and why (from its ``job_state.json`` and, for a SLURM job,
    the queue), then the command that reruns them; ``[]`` when every job finished."""
    missing = [job for job in jobs if not job.done]
    if not missing:
        return []
    from cluster import queue_states

    queued = queue_states([read_state(j.folder).get("job_id") for j in missing])
    lines = [f"{len(missing)} of {len(jobs)} jobs did not finish:"]
    for job in missing:
        lines.append(f"- {job.name}: {why_unfinished(job, queued)}")
    command = rerun_command(args.out)
    if command is not None:
        lines.append(f"Rerun them (finished jobs are skipped, interrupted fits resume from last.ckpt): {command}")
    return lines


def why_unfinished(job: Job, queued: dict[str, str]) -> str:
    """One job's reason, from its recorded state and, for a SLURM job, its state in the queue."""
    state = read_state(job.folder)
    log = job.folder / f"{job.stage}.log"
    where = f"SLURM job {state['job_id']}" if state.get("job_id") else "local"
    if not state:
        blocked = [f for f in job.after if not (f / "done").is_file()]
        return f"not run (its fit {blocked[0]} has not finished)" if blocked else "not run"
    if state.get("job_id") in queued:  # in the queue again (requeued after a stop, say): what it does now
        return f"{queued[state['job_id']].lower()} ({where})"
    if state["state"] == "failed" and state.get("rc") in _STOP_STATUS:  # the CLI's status after a stop: resumable
        return f"stopped by {_STOP_STATUS[state['rc']]} (exit code {state['rc']}, {where}); see {log}"
    if state["state"] == "failed" and isinstance(state.get("rc"), int) and state["rc"] < 0:  # ended by a signal
        return f"killed by {_signal_name(-state['rc'])} (exit code {state['rc']}, {where}); see {log}"
    if state["state"] == "failed":
        return f"failed with exit code {state.get('rc')} ({where}); see {log}"
    if state["state"] == "submitted":
        return f"submitted but never started ({where}: cancelled, or its dependency failed)"
    return (f"started but did not finish ({where}; killed, timed out, preempted or its node was lost); the last "
            f"lines are in {log}")


def select(jobs: list[Job], only: list[str]) -> list[Job]:
    """The jobs whose name contains one of ``only`` (every job for ``[""]``)."""
    return [j for j in jobs if any(part in j.name for part in only)]


def code_commit() -> str | None:
    """The commit of the code the jobs run (``git describe --always --dirty``: ``-dirty`` marks uncommitted
    changes), or ``None`` outside a git checkout."""
    try:
        found = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                               capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


def write_done(folder: Path, wall: float, cpu: float, commit: str | None = None) -> None:
    """Mark a job finished, with its wall-clock and CPU seconds (user + system, the job's process and the
    children it waited for) and the commit of the code that ran it."""
    (folder / "done").write_text(f"{wall:.1f} s\ncpu {cpu:.1f} s\n" + (f"commit {commit}\n" if commit else ""))


def read_done(folder: Path) -> tuple[float, float | None]:
    """``(wall, cpu)`` seconds from a ``done`` marker; ``cpu`` is ``None`` in markers written before it was kept."""
    lines = (folder / "done").read_text().split("\n")
    wall = float(lines[0].split()[0])
    cpu = next((float(x.split()[1]) for x in lines[1:] if x.startswith("cpu ")), None)
    return wall, cpu


#: The ``python -m lit_icl`` children running now, so that a SIGTERM to the driver reaches them (:func:`run_all`).
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()
#: Set once the driver got SIGTERM or Ctrl-C: jobs not yet started do not start.
_STOPPING = threading.Event()
#: The signal that stopped the driver (SIGTERM, or SIGINT for Ctrl-C): the driver exits with 128 + it.
_STOP_SIGNAL = [signal.SIGTERM]


#: The exit status of a job (and of the driver) stopped by SIGTERM or Ctrl-C, and the stop's name.
_STOP_STATUS = {128 + signal.SIGTERM: "SIGTERM", 128 + signal.SIGINT: "Ctrl-C"}


def _stopped_by() -> tuple[int, str]:
    """The driver's exit status after a stop, and the stop's name for its last line."""
    status = 128 + _STOP_SIGNAL[0]
    return status, _STOP_STATUS[status]


def _stop_children(signum: int, frame: Any) -> None:
    """The driver's SIGTERM and Ctrl-C handler: pass SIGTERM on to every running fit (each saves its ``last.ckpt``
    and exits 143, or 130 if Ctrl-C at the terminal reached it too) and start no more jobs; :func:`run_all` then
    exits 143 (130 for Ctrl-C). Without it the fits would outlive the driver, and a rerun would start a second
    process writing into the same run folder. SIGTERM, not SIGINT, is passed on: a fit that the terminal's Ctrl-C
    reached too would take a second SIGINT for "quit at once, without saving"."""
    if not _STOPPING.is_set():
        _STOP_SIGNAL[0] = signum
    _STOPPING.set()
    with _RUNNING_LOCK:
        for proc in _RUNNING:
            proc.send_signal(signal.SIGTERM)


def _ended(job: Job, rc: int) -> str:
    """How a job ended, for the driver's line about it: ``ok``, stopped by the driver's own stop (SIGTERM or Ctrl-C
    passed on to it: not a failure, the rerun runs it again) or failed, with its exit status and log."""
    if rc == 0:
        return "ok"
    log = job.folder / f"{job.stage}.log"
    if _STOPPING.is_set():
        again = "resumes it from its last.ckpt where it saved one" if job.stage == "fit" else "runs it again"
        return f"stopped by {_stopped_by()[1]} (rc={rc}, see {log}); the rerun {again}"
    if rc < 0:  # the job's process was ended by a signal (subprocess's negative status)
        return f"KILLED by {_signal_name(-rc)} (rc={rc}, see {log})"
    return f"FAILED rc={rc} (see {log})"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class _DriverStopped(Exception):
    """Raised in the driver's main thread by SIGTERM during a ``test`` stage (:func:`_stop_tests`)."""


def _stop_tests(signum: int, frame: Any) -> None:
    """The driver's SIGTERM and Ctrl-C handler while its forked workers run tests: a test keeps nothing worth
    saving, so the workers are stopped with it (:func:`run_all`) rather than left to finish as orphans beside a
    rerun's."""
    if not _STOPPING.is_set():
        _STOP_SIGNAL[0] = signum
    _STOPPING.set()
    raise _DriverStopped


def _test_worker_signals() -> None:
    """A forked test worker ends at SIGTERM (:func:`_end_test_worker`) and ignores Ctrl-C, which the terminal sends
    the whole process group: the driver alone handles it, by stopping the workers."""
    signal.signal(signal.SIGTERM, _end_test_worker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _end_test_worker(signum: int = signal.SIGTERM, frame: Any = None) -> None:
    """A test worker's SIGTERM handler: end the worker as SIGTERM's default action does (killed by it).

    The driver stops its tests with ``Pool.terminate()``, which sends each worker SIGTERM and then waits for it to
    end, holding the lock of the pool's task queue. SIGTERM's default action would do, but the CLI that the worker
    runs in-process replaces it while a test runs: Lightning's signal connector installs its own handler, which
    stops the test (the CLI exits 143) but not the worker, which then waited forever for that lock, and the driver
    for the worker. Lightning calls the handler it replaced, unless that is ``SIG_DFL``; so the worker's is this
    Python function, which Lightning calls after noting the stop, and the worker ends even inside a test."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # not reached: the signal ends the process before kill() returns


def run_job(job: Job, threads: int, dry: bool) -> tuple[Job, int, float]:
    cmd = [sys.executable, "-m", CLI_MODULE, *job.argv]
    if job.argv[0] == "fit" and (job.folder / "checkpoints" / "last.ckpt").is_file():
        cmd += ["--ckpt_path", "last"]  # an interrupted fit resumes where its last checkpoint left it
    line = " ".join(shlex.quote(c) for c in cmd)
    if dry:
        print(line, flush=True)
        return job, 0, 0.0
    if _STOPPING.is_set():  # the driver got SIGTERM or Ctrl-C before this job started: leave it for the rerun
        return job, _stopped_by()[0], 0.0
    job.write_spec(threads)  # the command it runs, which a rerun with other settings is compared with
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log_path = job.folder / f"{job.stage}.log"
    write_state(job.folder, "running", **{"executor": "local", "job_id": None, **slurm_fields(), "log": str(log_path)})
    start = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"$ {line}\n")
        log.flush()
        with _RUNNING_LOCK:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            _RUNNING.add(proc)
        if _STOPPING.is_set():  # SIGTERM or Ctrl-C came while it was starting
            proc.send_signal(signal.SIGTERM)
        # wait4, not wait: it returns this child's own resource usage (jobs run side by side in threads, so the
        # process-wide RUSAGE_CHILDREN would mix them).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    wall = time.perf_counter() - start
    finish_job(job, rc, wall, usage.ru_utime + usage.ru_stime)
    return job, rc, wall


def finish_job(job: Job, rc: int, wall: float, cpu: float) -> None:
    """Record how a sitting of ``job`` ended. A fit stopped before its end (SIGTERM, a requeue) keeps its seconds in
    ``job_state.json``, and its ``done`` marker, when a later sitting finishes it, counts every sitting's, so
    ``cost`` gives what the whole fit took, a failed attempt's seconds included (sittings killed outright, with no
    exit seen, are not counted)."""
    earlier = read_state(job.folder)
    wall += float(earlier.get("earlier_wall_s", 0.0))
    cpu += float(earlier.get("earlier_cpu_s", 0.0))
    if rc == 0:
        write_done(job.folder, wall, cpu, code_commit())
        write_state(job.folder, "done", rc=rc, earlier_wall_s=0.0, earlier_cpu_s=0.0)
    else:
        write_state(job.folder, "failed", rc=rc, earlier_wall_s=round(wall, 1), earlier_cpu_s=round(cpu, 1))


def run_job_in_process(job: Job, threads: int) -> tuple[Job, int, float]:
    """A ``test`` job inside a forked worker that imported Lightning once (saves ~10 s of imports per job)."""
    import contextlib
    import traceback

    import torch

    from lit_icl.cli import main as cli_main

    torch.set_num_threads(threads)
    job.write_spec(threads)  # the command it runs, which a rerun with other settings is compared with
    log_path = job.folder / f"{job.stage}.log"
    write_state(job.folder, "running", executor="local", job_id=None, log=str(log_path))
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_SELF)  # this worker runs one job at a time
    with open(log_path, "a") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        print("$ python -m lit_icl " + " ".join(shlex.quote(c) for c in job.argv), flush=True)
        import logging

        for name in ("lightning.pytorch", "lightning.fabric", "lit_icl"):  # their handlers hold the old stderr
            logging.getLogger(name).handlers = [logging.StreamHandler(log)]
        try:
            cli_main(job.argv)
            rc = 0
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # noqa: BLE001 - reported in the job's log, counted as a failure
            traceback.print_exc()
            rc = 1
    after = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter() - start
    finish_job(job, rc, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return job, rc, wall


def _in_process_star(item: tuple[Job, int]) -> tuple[Job, int, float]:
    """Run one test job in a forked worker (:func:`run_job_in_process`), keeping the worker's signal handling.

    The CLI's signal handlers may outlive its run or, in a handler that does not call the one it replaced, take a
    SIGTERM meant for the worker; so the worker's own are put back after each job, and a job that the CLI ended
    for SIGTERM (its status 143) ends the worker too, as ``Pool.terminate()`` expects (:func:`_end_test_worker`)."""
    try:
        job, rc, wall = run_job_in_process(*item)
    finally:
        _test_worker_signals()
    if rc == 128 + signal.SIGTERM:
        _end_test_worker()
    return job, rc, wall


def runnable(jobs: list[Job], executor: str, after_fits: bool = False) -> list[Job]:
    """The jobs not yet done whose fits have finished, saying how many there are and which wait on others.
    ``after_fits``: the dry run of an ``all`` stage, whose fits would run first."""
    todo = [j for j in jobs if not j.done]
    blocked = [j for j in todo if not all((f / "done").is_file() for f in j.after)]
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} done, {len(todo) - len(blocked)} to run ({executor})",
          flush=True)
    if blocked and after_fits:
        print(f"{len(blocked)} would run once the fits above have finished, e.g. {blocked[0].name}; a test's "
              "command names its fit's checkpoint, so `test --dry-run` prints them after the fits", flush=True)
    elif blocked:
        print(f"{len(blocked)} wait for runs that have not finished (run `fit` first), e.g. {blocked[0].name}",
              flush=True)
    return [j for j in todo if j not in blocked]


def run_all(jobs: list[Job], args: argparse.Namespace, stage: str) -> int:
    """Run the jobs of one stage here, ``args.jobs`` at a time; the number that failed."""
    todo = runnable(jobs, f"{args.jobs} at a time",
                    after_fits=stage == "test" and getattr(args, "stage", None) == "all" and args.dry_run)
    failed = 0
    if stage == "test" and not args.dry_run and todo:
        import multiprocessing

        import lit_icl.cli  # noqa: F401 - imported once here, inherited by the forked workers

        ctx = multiprocessing.get_context("fork")
        main_thread = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, _stop_tests) for s in (signal.SIGTERM, signal.SIGINT)} if main_thread else {}
        try:
            # Workers are forked from this process, whose handlers are ours: they get their own.
            with ctx.Pool(args.jobs, maxtasksperchild=20, initializer=_test_worker_signals) as pool:
                results = pool.imap_unordered(_in_process_star, [(j, args.threads) for j in todo])
                for job, rc, secs in results:
                    print(f"{time.strftime('%H:%M:%S')} {job.name}: {_ended(job, rc)}, {secs:.0f} s", flush=True)
                    failed += rc != 0
        except _DriverStopped:  # leaving the pool's block terminated its workers, and the tests they were running
            status, name = _stopped_by()
            for job in todo:
                if not job.done and read_state(job.folder).get("state") == "running":
                    write_state(job.folder, "failed", rc=status)
            print(f"stopped by {name}: the running tests were stopped; rerun the same command to run them and the "
                  "rest", file=sys.stderr, flush=True)
            sys.exit(status)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return failed
    if args.dry_run:  # one command a line, in order (threads printing at once could run two lines together)
        for job in todo:
            run_job(job, args.threads, dry=True)
        return 0
    main_thread = threading.current_thread() is threading.main_thread()  # only it may install a handler
    previous = {s: signal.signal(s, _stop_children) for s in (signal.SIGTERM, signal.SIGINT)} if main_thread else {}
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            for job, rc, secs in pool.map(lambda j: run_job(j, args.threads, False), todo):
                if not job.folder.exists():  # not started: the driver got SIGTERM or Ctrl-C first
                    print(f"{job.name}: not started ({_stopped_by()[1]})", flush=True)
                    continue
                print(f"{time.strftime('%H:%M:%S')} {job.name}: {_ended(job, rc)}, {secs:.0f} s", flush=True)
                failed += rc != 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if _STOPPING.is_set():
        status, name = _stopped_by()
        print(f"stopped by {name}: the running fits saved their last.ckpt; rerun the same command to resume them",
              file=sys.stderr, flush=True)
        sys.exit(status)
    return failed


def run_job_from_spec(folder: Path) -> int:
    """Run the job in ``folder/job.json`` (a SLURM task's work) unless it is done; its exit code.

    A fit that SLURM requeued, or that a resubmitted grid runs again, finds its ``last.ckpt`` and resumes from it.
    A job whose fit has not finished exits 3 at once, naming it. SIGTERM (``scancel``, a requeue: SLURM sends it to
    every process of the task) is passed on to the job, which is waited for, so its stop is recorded (exit code 143:
    "stopped by SIGTERM") rather than left as a job that was running when it vanished.
    """
    signal.signal(signal.SIGTERM, _stop_children)
    job, threads = Job.read_spec(folder)
    if job.done:
        print(f"{job.name}: already done", flush=True)
        return 0
    blocked = [f for f in job.after if not (f / "done").is_file()]
    if blocked:
        write_state(job.folder, "failed", rc=3, **slurm_fields())
        print(f"{job.name}: its fit {blocked[0]} has not finished; rerun the grid once it has", file=sys.stderr)
        return 3
    _, rc, _ = run_job(job, threads, dry=False)
    return rc


def cost(sources: list[Path]) -> str:
    """Wall-clock and CPU time of every finished job of the grids (run folders or tidy CSVs), by stage."""
    from tidy import load

    totals: dict[str, list[float]] = {}
    for source in sources:
        for run, record in load(source).items():
            if record.wall is None:  # run by hand: no `done` marker, no recorded cost
                continue
            stage = "test" if "_test" in run.rsplit("/", 1)[-1] else "fit"
            t = totals.setdefault(stage, [0, 0.0, 0.0, 0])
            t[0] += 1
            t[1] += record.wall
            t[2] += record.cpu or 0.0
            t[3] += record.cpu is None
    rows = [[stage, str(n), f"{wall / 3600:.2f}", f"{cpu / 3600:.2f}" + (f" ({missing} without)" if missing else "")]
            for stage, (n, wall, cpu, missing) in sorted(totals.items())]
    n, wall, cpu, missing = (sum(t[i] for t in totals.values()) for i in range(4))
    rows.append(["all", str(n), f"{wall / 3600:.2f}", f"{cpu / 3600:.2f}" + (f" ({missing} without)" if missing else "")])
    return markdown_table(["jobs", "finished", "wall-clock (job-hours)", "CPU (hours)"], rows)


def not_a_command(module: str, instead: str) -> NoReturn:
    """What a library module of the drivers does when run as a script: say in one line (stderr) that it is none, and
    what to run ``instead``, and exit 2, rather than exit 0 having done nothing (``--help`` included)."""
    print(f"{Path(module).name}: a module of the experiment drivers, not a command; {instead}", file=sys.stderr,
          flush=True)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Summaries of finished grids: their cost, or their tidy CSV.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cost", help="wall-clock and CPU hours of the finished jobs of each grid (folder or CSV)")
    c.add_argument("sources", type=Path, nargs="+")
    r = sub.add_parser("run-job", help="run the job a driver wrote into FOLDER/job.json (what a SLURM task runs)")
    r.add_argument("folder", type=Path)
    t = sub.add_parser("tidy", help="write the finished runs under SOURCE as one tidy CSV (see experiments/tidy.py)")
    t.add_argument("source", type=Path)
    t.add_argument("dest", type=Path)
    args = parser.parse_args(argv)

    def one_line(message: str) -> NoReturn:  # the drivers' refusal: one line naming the fix, status 2
        _refuse(f"runner.py {args.command}: error: {message}")

    parser.error = one_line  # type: ignore[method-assign]
    if args.command == "run-job":
        sys.exit(run_job_from_spec(args.folder))
    if args.command == "cost":
        missing = [str(p) for p in args.sources if not (p.is_dir() or (p.suffix == ".csv" and p.is_file()))]
        if missing:
            parser.error(f"no such run folder or results CSV: {', '.join(missing)}")
        print(cost(args.sources))
    else:
        from tidy import read_folders, write

        if not args.source.is_dir():
            parser.error(f"no such folder: {args.source}")
        if args.dest.suffix != ".csv":
            parser.error(f"{args.dest}: the tidy table is a .csv file; name one")
        records = read_folders(args.source)
        if not records:
            parser.error(f"no finished run (a folder with a `done` marker) under {args.source}")
        print(f"{write(records, args.dest)} rows of {len(records)} runs written to {args.dest}")


if __name__ == "__main__":
    main()

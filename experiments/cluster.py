"""The SLURM executor of the experiment drivers: a grid's stages as SLURM job arrays, submitted through submitit.

    python experiments/mmca_avmnist_table1.py all --executor slurm --partition gpu --gpus-per-job 1 --jobs 8 \\
        --time-min 240 --overlay my_gpu_trainer.yaml --out runs/table1

Each stage of a driver (``fit``, ``test``) becomes one job array: task ``i`` runs ``python experiments/runner.py
run-job FOLDER`` on the job the driver wrote into ``FOLDER/job.json``, exactly what ``--executor local`` runs (same
command line, threads, ``done`` marker, resume from ``last.ckpt``). ``--jobs`` caps how many tasks of an array run
at once (``--array=0-N%jobs``); ``--gpus-per-job``, ``--cpus-per-job``, ``--mem-gb``, ``--time-min`` and
``--partition`` size each task, and ``--sbatch KEY=VALUE`` passes any other ``sbatch`` option
(``account=...``, ``qos=...``, ``constraint=a100``).

Stage ``all`` submits the fit array, then a one-CPU *stage job* that depends on it (``--dependency=afterany``, not
polling): once every fit has ended, that job builds the test jobs (a test may read its fit's checkpoints, so they
are built after the fits) and submits the test array. The driver waits until no job of the grid is left in the
queue (``--no-wait``: it returns after submitting), then prints the report, and names any job that did not finish
with the command that reruns it. Every job is submitted with ``--requeue``: a task that SLURM requeues (node
failure, preemption, ``scontrol requeue``) runs again and resumes from its last checkpoint; a task warned of its
time limit requeues itself (:class:`RunJob`); and a grid resubmitted after a ``scancel`` skips every job that is
``done`` and resumes the rest.

The tasks share ``torch.compile``'s on-disk cache in ``<out>/compile_cache`` (:func:`compile_cache_env`), so a
grid compiles each net once, whichever nodes its fits land on. submitit keeps its batch scripts, pickles and logs
under ``<out>/slurm/<job id>/``; each job's own log is in its run folder (``fit.log``, ``test.log``), with
``job_state.json`` (SLURM job id, node, requeues, state, exit code).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

#: The job state ``squeue`` gives to a job that is still in the queue, by its ``%T`` name.
QUEUE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "PREEMPTED")


#: How long a task whose fit ended by SLURM's time-limit warning waits for that warning itself (see :class:`RunJob`).
TIMEOUT_SIGNAL_WAIT_S = 60


class RunJob:
    """What a SLURM task runs: ``python experiments/runner.py run-job FOLDER``, streaming its output to the task's
    log, and failing the task when it fails.

    It is *checkpointable* in submitit's sense: when SLURM warns a task that its time limit is near (``--signal
    USR2``, 90 s before), submitit calls :meth:`checkpoint` and requeues the task with what it returns, this same
    job; the requeued task finds the fit's ``last.ckpt`` and resumes. So a fit longer than ``--time-min`` runs in
    several sittings by itself, up to ``--max-requeues`` of them; each sitting loses only the work since its last
    checkpoint. (The fit itself ends at the warning signal; its checkpoints are written atomically.)

    ``env`` holds defaults for the task's environment: a variable the task's environment already sets (SLURM
    passes the submitting shell's) is kept.
    """

    def __init__(self, command: list[str], cwd: str, env: dict[str, str] | None = None):
        self.command = command
        self.cwd = cwd
        self.env = dict(env or {})

    def __call__(self, folder: str) -> int:
        env = {**self.env, **os.environ}
        done = subprocess.run([*self.command, folder], cwd=self.cwd, check=False, env=env)
        if done.returncode == -signal.SIGUSR2:
            # SLURM's time-limit warning reached the fit first and ended it (its checkpoints are whole). The same
            # signal is on its way to this process, whose submitit handler requeues the task and exits: wait for
            # it here, rather than fail the task in the moment between the two.
            time.sleep(TIMEOUT_SIGNAL_WAIT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(self.command)} {folder} exited with {done.returncode}; see the job's "
                               "log in its run folder")
        return 0

    def checkpoint(self, folder: str) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, folder)


def add_slurm_args(parser: argparse.ArgumentParser) -> None:
    """The options of ``--executor slurm`` (ignored by ``--executor local``)."""
    group = parser.add_argument_group("SLURM (--executor slurm)")
    group.add_argument("--partition", default=None, help="the partition of every job (default: the cluster's)")
    group.add_argument("--gpus-per-job", type=int, default=0, help="GPUs of each job (with an overlay that trains "
                       "on the GPU, e.g. `trainer: {accelerator: gpu, devices: 1}`)")
    group.add_argument("--cpus-per-job", type=int, default=None, help="CPUs of each job (default: --threads)")
    group.add_argument("--mem-gb", type=float, default=None, help="memory of each job in GB (default: the cluster's)")
    group.add_argument("--time-min", type=int, default=240,
                       help="time limit of each job in minutes; a fit that needs longer requeues itself and resumes "
                            "from its last checkpoint (--max-requeues times)")
    group.add_argument("--sbatch", nargs="+", default=[], metavar="KEY=VALUE",
                       help="more sbatch options for every job, e.g. account=myproject qos=high constraint=a100 "
                            "(a KEY alone is a flag, e.g. exclusive)")
    group.add_argument("--max-requeues", type=int, default=10,
                       help="how often a job cut by --time-min requeues itself to resume from its last checkpoint")
    group.add_argument("--no-wait", action="store_true",
                       help="return once the grid is submitted instead of waiting for it and printing the report")
    group.add_argument("--poll-s", type=float, default=10.0, help=argparse.SUPPRESS)  # the wait's squeue interval
    # Set on the stage job that stage `all` submits after the fits: it submits the tests.
    group.add_argument("--from-stage", choices=("fit", "test"), default="fit", help=argparse.SUPPRESS)


def check_slurm_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line, a SLURM run that cannot start: no submitit, no ``sbatch``, or bad sizes."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        parser.error("--executor slurm needs submitit: pip install -e '.[cluster]'")
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        parser.error("--executor slurm needs SLURM's sbatch and squeue on PATH (on a machine without a cluster, "
                     "scripts/slurm_local.sh start runs one); or use --executor local")
    for name in ("gpus_per_job", "cpus_per_job", "time_min", "mem_gb", "max_requeues"):
        value, may_be_zero = getattr(args, name), name in ("gpus_per_job", "max_requeues")
        if value is not None and value < (0 if may_be_zero else 1e-9):
            parser.error(f"--{name.replace('_', '-')} {value} must be {'0 or more' if may_be_zero else 'positive'}")
    if args.poll_s <= 0:  # 0 would ask squeue without a pause for as long as the grid runs
        parser.error(f"--poll-s {args.poll_s}: give the seconds between looks at the queue, more than 0 (default 10)")
    for item in args.sbatch:
        if not item.split("=", 1)[0].strip() or item.startswith("-"):
            parser.error(f"--sbatch {item!r}: give each option as KEY=VALUE without dashes, e.g. account=myproject")
    args.sbatch_options = {key.strip(): (value if sep else True)
                           for key, sep, value in (item.partition("=") for item in args.sbatch)}


def _out_digest(out: Any) -> str:
    return hashlib.sha1(str(out).encode()).hexdigest()[:8]


def grid_name(args: argparse.Namespace) -> str:
    """The SLURM job name of every job of a grid: the driver and a hash of its ``--out``, so ``squeue --name``
    finds exactly this grid's jobs and two grids of one driver never wait on each other."""
    return f"lit_icl.{args.script.stem}.{_out_digest(args.out)}"


def queued_in_folder(out: Any) -> dict[str, str]:
    """``{job id: state}`` of the jobs in SLURM's queue that write into the grid folder ``out``, whichever driver
    submitted them (their names end in the hash of ``out``: :func:`grid_name`); ``{}`` without SLURM. A stage job
    of stage ``all`` is left out when it asks (``SLURM_JOB_ID``): it is the grid's own next step."""
    if shutil.which("squeue") is None:
        return {}
    found = subprocess.run(["squeue", "--noheader", "--array", "--format=%i %T %j"], capture_output=True,
                           text=True, check=False)
    if found.returncode != 0:
        return {}
    suffix, me = f".{_out_digest(out)}", os.environ.get("SLURM_JOB_ID")
    states = {}
    for line in found.stdout.splitlines():
        job_id, state, name = (line.split() + ["", ""])[:3]
        if name.startswith("lit_icl.") and name.endswith(suffix) and state in QUEUE_STATES and job_id != me:
            states[job_id] = state
    return states


def job_sizes(args: argparse.Namespace, *, stage_job: bool = False) -> dict[str, Any]:
    """The ``sbatch`` options that size a grid's jobs, by submitit's names (``sbatch``'s with ``_`` for ``-``).

    ``stage_job``: the job that submits the test array, one CPU for ten minutes and no GPU; it keeps the partition
    and the ``--sbatch`` options, since a cluster may take no job without the account or QOS they name.
    """
    sizes: dict[str, Any] = {"job_name": grid_name(args), "time": 10 if stage_job else args.time_min,
                             "cpus_per_task": 1 if stage_job else (args.cpus_per_job or args.threads)}
    if args.partition:
        sizes["partition"] = args.partition
    if args.gpus_per_job and not stage_job:
        sizes["gpus_per_node"] = args.gpus_per_job
    if args.mem_gb and not stage_job:
        sizes["mem"] = f"{int(args.mem_gb * 1024)}MB"
    return sizes


def executor(args: argparse.Namespace, *, stage_job: bool = False, dependency: str | None = None) -> Any:
    """A submitit SLURM executor with :func:`job_sizes`, the ``--sbatch`` options and ``--requeue``."""
    import submitit

    ex = submitit.SlurmExecutor(folder=args.out / "slurm" / "%j", max_num_timeout=args.max_requeues)
    extra: dict[str, Any] = {"requeue": True, **args.sbatch_options}
    if dependency is not None:
        extra["dependency"] = dependency
    ex.update_parameters(**job_sizes(args, stage_job=stage_job), array_parallelism=args.jobs,
                         additional_parameters=extra, stderr_to_stdout=True)
    return ex


def sbatch_options(args: argparse.Namespace) -> list[str]:
    """The command-line form of what :func:`executor` gives submitit for a grid's jobs (``--requeue`` aside)."""
    options = {**job_sizes(args), **args.sbatch_options}
    return [f"--{key.replace('_', '-')}" if value is True else f"--{key.replace('_', '-')}={value}"
            for key, value in options.items()]


def submission_refusal(stderr: str, returncode: int) -> str:
    """The reason in ``sbatch``'s complaint: its last ``error:`` line, else its first line (an option it cannot
    parse, ``sbatch: option '--account' requires an argument``), without the ``sbatch:`` prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("sbatch: error: ") for line in lines if line.startswith("sbatch: error: ")]
    if errors:
        return errors[-1]
    return lines[0].removeprefix("sbatch: ") if lines else f"exit code {returncode}"


def check_submission(args: argparse.Namespace) -> None:
    """Ask SLURM whether it would take the grid's jobs (``sbatch --test-only``: nothing is queued) before anything
    is written, and stop with one line and exit 2 if it would not (an unknown partition, account or QOS, more
    GPUs, CPUs, memory or time than the cluster allows)."""
    # The script (--wrap) comes first: a bare --sbatch key that needs a value (``--sbatch account``) then gets
    # sbatch's "requires an argument", not --wrap as its value and "true" taken for a script file.
    tried = subprocess.run(["sbatch", "--test-only", "--wrap", "true", *sbatch_options(args)], capture_output=True,
                           text=True, check=False)
    if tried.returncode != 0:
        reason = submission_refusal(tried.stderr, tried.returncode)
        print(f"{args.script.name}: error: SLURM would not take the grid's jobs ({reason}); check that sbatch "
              "reaches the cluster (sinfo), then --partition, --gpus-per-job, --cpus-per-job, --mem-gb, --time-min "
              "and --sbatch", file=sys.stderr)
        sys.exit(2)


def compile_cache_env(args: argparse.Namespace) -> dict[str, str]:
    """Where a grid's SLURM tasks keep ``torch.compile``'s caches: ``<out>/compile_cache``, shared by all of them.

    On a GPU the CLI's default ``--compile.mode auto`` compiles each fit, and inductor caches what it compiled on
    disk (``TORCHINDUCTOR_CACHE_DIR``; without it, a folder in the node's ``/tmp``). A grid's fits compile the same
    graphs, but a task on another node, or on a node whose ``/tmp`` is private to each job, or a fit requeued onto
    another node, would find that cache empty and compile from scratch: 39 s for IC-SSL's net on our CPU machine
    against 5 s from a warm cache (``experiments/results/compile_cpu.md``). The grid's folder is on a file system every node sees, so the tasks
    share one cache there. A ``TORCHINDUCTOR_CACHE_DIR`` set where the grid is submitted is kept.
    """
    return {"TORCHINDUCTOR_CACHE_DIR": str((args.out / "compile_cache").resolve())}


def submit_array(args: argparse.Namespace, jobs: Sequence[Any]) -> str | None:
    """Submit ``jobs`` (runner ``Job``s) as one SLURM job array; the array's job id, or ``None`` if none."""
    import cloudpickle
    from runner import REPO, write_state

    if not jobs:
        return None
    for job in jobs:
        job.write_spec(args.threads)
    # The task's class travels in the pickle, so the node needs no import path to experiments/.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    task = RunJob([sys.executable, str(REPO / "experiments" / "runner.py"), "run-job"], cwd=str(REPO),
                  env=compile_cache_env(args))
    submitted = executor(args).map_array(task, [str(job.folder) for job in jobs])
    for job, handle in zip(jobs, submitted):
        write_state(job.folder, "submitted", executor="slurm", job_id=handle.job_id, rc=None,
                    slurm_log=str(handle.paths.stdout), log=str(job.folder / f"{job.stage}.log"))
    array = submitted[0].job_id.split("_")[0]
    # submitit submits a single job as a plain job (id 7, not 7_0)
    what = (f"{len(jobs)} {jobs[0].stage} jobs as SLURM array {array} ({grid_name(args)}, {args.jobs} at a time)"
            if len(jobs) > 1 else f"1 {jobs[0].stage} job as SLURM job {array} ({grid_name(args)})")
    print(f"submitted {what}", flush=True)
    return array


def submit_tests_after(args: argparse.Namespace, fit_array: str) -> str:
    """The stage job of ``all``: once every task of ``fit_array`` has ended, it runs this driver again with
    ``--from-stage test --no-wait``, which builds the test jobs and submits them."""
    import submitit
    from runner import REPO

    # The flags go first: a driver may end its command line with a catch-all of CLI overrides (``-- ...``).
    command = [sys.executable, str(args.script), "--from-stage", "test", "--no-wait", *args.argv]
    ex = executor(args, stage_job=True, dependency=f"afterany:{fit_array}")
    job = ex.submit(submitit.helpers.CommandFunction(command, cwd=REPO))
    print(f"submitted the test stage as SLURM job {job.job_id}, after array {fit_array}", flush=True)
    return job.job_id


def queue_states(job_ids: Sequence[str | None] = (), name: str | None = None) -> dict[str, str]:
    """``{job id: state}`` of the jobs still in SLURM's queue, one entry per array task (``123_4``), for the
    given ids or job name; ``{}`` where SLURM is not installed."""
    if shutil.which("squeue") is None:
        return {}
    command = ["squeue", "--noheader", "--array", "--format=%i %T"]
    ids = sorted({str(i).split("_")[0] for i in job_ids if i})
    if name is not None:
        command.append(f"--name={name}")
    elif ids:
        command.append(f"--jobs={','.join(ids)}")
    else:
        return {}
    found = subprocess.run(command, capture_output=True, text=True, check=False)
    if found.returncode != 0:  # e.g. ids that the controller has already forgotten
        return {}
    states = {}
    for line in found.stdout.splitlines():
        job_id, _, state = line.strip().partition(" ")
        if state in QUEUE_STATES:
            states[job_id] = state
    return states


def wait_for_grid(args: argparse.Namespace) -> None:
    """Wait until no job of the grid is left in the queue, printing how many are pending and running as that
    changes. Stopped while it waits (Ctrl-C, SIGTERM), the driver says in one line that the jobs go on in the queue
    without it and how to read or cancel them, and exits 130 (143): stopping the driver stops no job."""
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    last = None
    try:
        while True:
            states = queue_states(name=grid_name(args))
            if not states:
                return
            summary = ", ".join(f"{sum(s == k for s in states.values())} {k.lower()}"
                                for k in sorted(set(states.values())))
            if summary != last:
                print(f"{time.strftime('%H:%M:%S')} waiting for {len(states)} SLURM jobs: {summary}", flush=True)
                last = summary
            time.sleep(args.poll_s)
    except KeyboardInterrupt as stopped:
        signum = stopped.args[0] if stopped.args else signal.SIGINT
        script, out = (p.relative_to(os.getcwd()) if p.is_relative_to(os.getcwd()) else p
                       for p in (args.script, args.out))
        print(f"stopped waiting ({'SIGTERM' if signum == signal.SIGTERM else 'Ctrl-C'}): the grid's SLURM jobs go on "
              f"in the queue without this driver; `python {script} report --out {out}` reads the grid "
              f"any time, `scancel --name={grid_name(args)}` cancels its jobs", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_stage_on_slurm(args: argparse.Namespace, fit_jobs: Callable[[argparse.Namespace], list],
                       test_jobs: Callable[[argparse.Namespace], list],
                       report: Callable[[argparse.Namespace], str] | None) -> int:
    """``--executor slurm``: submit the stage's jobs that are not done (a dry run prints them), wait for them
    unless ``--no-wait``, and return the number of the driver's jobs that did not finish (0 when not waiting)."""
    from runner import claim_grid, finish_all, print_unfinished, record_grid, runnable, select

    if args.dry_run:
        for stage, build in (("fit", fit_jobs), ("test", test_jobs)):
            if args.stage in (stage, "all"):
                for job in runnable(select(build(args), args.only), "dry run, SLURM",
                                    after_fits=stage == "test" and args.stage == "all"):
                    print(f"{grid_name(args)} {stage}: python -m lit_icl {' '.join(job.argv)}")
        return 0
    if args.from_stage == "fit":
        check_submission(args)
        claim_grid(args)
        record_grid(args)
    fit_array = None
    if args.stage in ("fit", "all") and args.from_stage == "fit":
        fit_array = submit_array(args, runnable(select(fit_jobs(args), args.only), "SLURM"))
    if args.stage == "test" or (args.stage == "all" and fit_array is None):
        submit_array(args, runnable(select(test_jobs(args), args.only), "SLURM"))
    elif args.stage == "all":
        submit_tests_after(args, fit_array)
    if args.no_wait:
        return 0
    wait_for_grid(args)
    if args.stage == "all":
        return finish_all(args, fit_jobs, test_jobs, report)
    return print_unfinished(select((fit_jobs if args.stage == "fit" else test_jobs)(args), args.only), args)


if __name__ == "__main__":
    from runner import not_a_command

    not_a_command(__file__, "run a grid on SLURM with a driver's `--executor slurm`, e.g. `python "
                  "experiments/mmca_avmnist_table1.py all --executor slurm --partition gpu --out runs/table1` "
                  "(its --help lists the SLURM options)")

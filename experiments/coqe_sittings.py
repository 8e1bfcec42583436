"""CoQE and its Transformer baseline trained side by side towards the paper's 10^5 steps, one sitting at a time.

The main command (``configs/coqe_omniglot.yaml``) and its baseline (``+ configs/coqe/omniglot/transformer.yaml``) at
paper scale need a GPU for hours; a GPU may be at hand for minutes at a time. Each ``sit`` trains both runs at once
(two processes sharing the device) for ``--seconds`` more of training time, each resumed with ``--ckpt_path last``
from the state folder. A run resumed this way ends bit-identical to one that never stopped, also when a sitting
ends inside an epoch (``docs/usage.md``, Resume). ``--out`` packs what the next sitting needs into a few files
(each run's ``last.ckpt`` and a ``.tar.gz`` of its logs and config), which ``unpack`` puts back on another machine::

    python experiments/coqe_sittings.py sit --seconds 240 --out /tmp/sitting      # train, then pack
    python experiments/coqe_sittings.py unpack --from /tmp/sitting                # on the next machine
    python experiments/coqe_sittings.py report --csv experiments/results/coqe_sittings.csv

``report`` reads the validation curves (ICL, IWL, and CoQE's static head) from the runs' TensorBoard events. The
paper's Fig. 4 and Table 1 are the reference (docs/coqe_omniglot.md); the runs train on the offline ``glyphs``
stand-in unless ``data/omniglot-py`` exists. A sitting stopped by SIGTERM (``timeout``, a lease ending) or Ctrl-C
passes SIGTERM on to both runs, which save their ``last.ckpt``, then reports and packs as at its end and exits 143
(130). ``--set`` passes further CLI arguments to both runs (for example a
CPU-scale overlay, to try the driver without a GPU).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared runner beside this file
from runner import REPO, logged_scalars, markdown_table

#: The two runs: name -> configs. The names are the runs' logger names under the state folder.
ARMS: dict[str, list[str]] = {
    "coqe": ["configs/coqe_omniglot.yaml"],
    "transformer": ["configs/coqe_omniglot.yaml", "configs/coqe/omniglot/transformer.yaml"],
}
#: Validation accuracies that make the curves (the static head is CoQE's only).
TAGS = ("val/acc/icl", "val/acc/iwl", "val/acc/iwl_static")
#: What ``--out`` may hold: a device machine returns at most 8 files of at most 16 MiB each.
MAX_FILE_BYTES = 16 * 2**20


def run_folder(state: Path, arm: str) -> Path | None:
    """The newest ``version_N`` folder of a run, or ``None`` before its first sitting."""
    versions = sorted((state / arm).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    return versions[-1] if versions else None


def trained_so_far(state: Path, arm: str) -> tuple[int, float]:
    """``(steps, seconds of training)`` in a run's ``last.ckpt``: its global step and Lightning's ``Timer`` state,
    which ``--trainer.max_time`` counts against; ``(0, 0.0)`` before the first sitting."""
    folder = run_folder(state, arm)
    last = folder / "checkpoints/last.ckpt" if folder else None
    if last is None or not last.is_file():
        return 0, 0.0
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    timer = ckpt.get("callbacks", {}).get("Timer", {})
    return int(ckpt["global_step"]), float(timer.get("time_elapsed", {}).get("train", 0.0))


def max_time(seconds: float) -> str:
    """``--trainer.max_time`` for a total of ``seconds``, as Lightning reads it: ``DD:HH:MM:SS``."""
    s = round(seconds)
    return f"{s // 86400:02d}:{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fit_command(state: Path, arm: str, total_seconds: float, compile_mode: str, extra: list[str]) -> list[str]:
    """The ``python -m lit_icl fit`` call of one run's sitting: until ``total_seconds`` of training in all."""
    configs = [a for c in ARMS[arm] for a in ("--config", c)]
    # A sitting killed before its first checkpoint leaves a folder without last.ckpt: the next one starts afresh.
    folder = run_folder(state, arm)
    resume = ["--ckpt_path", "last"] if folder and (folder / "checkpoints/last.ckpt").is_file() else []
    compiled = ["--compile.mode", compile_mode]  # named even when off: the CLI's default is auto
    return [sys.executable, "-m", "lit_icl", "fit", *configs,
            "--trainer.logger.init_args.save_dir", str(state), "--trainer.logger.init_args.name", arm,
            "--trainer.enable_progress_bar", "false",
            "--checkpoint.save_top_k", "0",  # last.ckpt only: one file per run to carry to the next sitting
            "--trainer.max_time", max_time(total_seconds), *compiled, *resume, *extra]


def sit(args: argparse.Namespace) -> None:
    """Train both runs for ``args.seconds`` more, at the same time; then print where they stand and pack."""
    args.state.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    stopped: list[int] = []  # the signal that stopped the sitting, once one has

    def stop(signum: int, frame: object) -> None:
        """SIGTERM (``timeout``, the end of a machine's lease) or Ctrl-C: pass SIGTERM on to both runs, which save
        their ``last.ckpt`` and exit, then report and pack as at the sitting's end. Without it the driver died
        alone, its runs trained on as orphans and nothing was packed for the next machine. SIGTERM, not SIGINT: a
        run that the terminal's Ctrl-C reached too would take a second SIGINT for "quit at once, without saving"."""
        if not stopped:
            stopped.append(signum)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        before = {arm: trained_so_far(args.state, arm) for arm in ARMS}
        for arm in ARMS:
            if stopped:  # stopped before this run started: it is not started
                break
            cmd = fit_command(args.state, arm, before[arm][1] + args.seconds, args.compile, args.set)
            log = (args.state / f"{arm}.log").open("a")
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            procs[arm] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        failed = [arm for arm, proc in procs.items() if proc.wait() != 0]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for arm in ARMS:
        (steps0, secs0), (steps1, secs1) = before[arm], trained_so_far(args.state, arm)
        rate = (steps1 - steps0) / (secs1 - secs0) if secs1 > secs0 else 0.0
        print(f"{arm:12s} steps {steps0} -> {steps1} ({rate:.1f} steps/s of training time this sitting), "
              f"training time {secs1 / 60:.1f} min in all")
    print(report_table(args.state))
    if args.out:
        pack(args.state, args.out)
    if stopped:
        name = "Ctrl-C" if stopped[0] == signal.SIGINT else "SIGTERM"
        print(f"coqe_sittings: stopped by {name}; each run saved its last.ckpt at the step it reached"
              + (" (packed into --out)" if args.out else "") + ": `sit` again continues them", file=sys.stderr)
        sys.exit(128 + stopped[0])
    if failed:
        sys.exit(f"coqe_sittings: the {' and '.join(failed)} run failed; see {args.state}/<run>.log")


def pack(state: Path, out: Path) -> None:
    """Each run's ``last.ckpt`` and a ``.tar.gz`` of the rest of its folder (logs, config), plus ``curves.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    for arm in ARMS:
        folder = run_folder(state, arm)
        if folder is None:
            continue
        if not (folder / "checkpoints/last.ckpt").is_file():
            # A run that failed (or was stopped) before its first checkpoint has nothing to resume from; the other
            # run is still packed, and the next sitting starts this one afresh.
            print(f"coqe_sittings: {folder} has no checkpoints/last.ckpt yet (see {state / arm}.log); not packed, the "
                  "next sitting starts it afresh", file=sys.stderr)
            continue
        shutil.copy2(folder / "checkpoints/last.ckpt", out / f"{arm}_last.ckpt")
        with tarfile.open(out / f"{arm}_run.tar.gz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name, filter=lambda info: None if "checkpoints" in info.name else info)
    write_curves(state, out / "curves.csv")
    big = [p.name for p in out.iterdir() if p.stat().st_size > MAX_FILE_BYTES]
    if big:
        print(f"coqe_sittings: {big} exceed 16 MiB, more than a device machine returns", file=sys.stderr)


def unpack(args: argparse.Namespace) -> None:
    """Put packed runs back into the state folder, ready for the next ``sit``."""
    packed = [arm for arm in ARMS if (args.source / f"{arm}_run.tar.gz").is_file()]
    missing = [f"{arm}_last.ckpt" for arm in packed if not (args.source / f"{arm}_last.ckpt").is_file()]
    if not packed or missing:
        what = f"{', '.join(missing)} missing" if missing else "no packed runs (coqe_run.tar.gz, transformer_run.tar.gz)"
        sys.stderr.write(f"coqe_sittings: {args.source}: {what}; give the folder that `sit --out` wrote\n")
        sys.exit(2)
    for arm in packed:
        with tarfile.open(args.source / f"{arm}_run.tar.gz") as tar:
            version = tar.getnames()[0].split("/")[0]
            tar.extractall(args.state / arm, filter="data")
        checkpoints = args.state / arm / version / "checkpoints"
        checkpoints.mkdir(parents=True, exist_ok=True)
        shutil.copy2(args.source / f"{arm}_last.ckpt", checkpoints / "last.ckpt")
        print(f"{arm}: {args.state / arm / version} (step {trained_so_far(args.state, arm)[0]})")


def curves(state: Path) -> dict[str, dict[str, dict[int, float]]]:
    """``{run: {tag: {step: value}}}`` from the runs' TensorBoard events (every sitting's)."""
    return {arm: logged_scalars(folder, TAGS) for arm in ARMS if (folder := run_folder(state, arm))}


def write_curves(state: Path, path: Path) -> None:
    """The curves as a tidy CSV: one row per run, metric and validation step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["run", "metric", "step", "value"])
        for arm, by_tag in curves(state).items():
            for tag, points in by_tag.items():
                writer.writerows([arm, tag.removeprefix("val/acc/"), step + 1, f"{value:.4f}"]
                                 for step, value in sorted(points.items()))


def report_table(state: Path, every: int = 10_000) -> str:
    """Validation accuracies of both runs about every ``every`` steps, and at their last validation."""
    rows = []
    for arm, by_tag in curves(state).items():
        steps = sorted(by_tag["val/acc/icl"])
        shown = [s for i, s in enumerate(steps) if i == len(steps) - 1 or (s + 1) // every < (steps[i + 1] + 1) // every]
        for step in shown:
            rows.append([arm, str(step + 1), *(f"{by_tag[t][step]:.3f}" if step in by_tag[t] else "-" for t in TAGS)])
    return markdown_table(["run", "step", "ICL", "IWL", "IWL static head"], rows) if rows else "no validation yet"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state", type=Path, default=REPO / "runs/coqe_sittings", help="the runs' folder")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sit", help="train both runs for --seconds more")
    p.add_argument("--seconds", type=float, required=True, help="training time this sitting adds to each run")
    p.add_argument("--compile", default="reduce-overhead", choices=("off", "default", "reduce-overhead"),
                   help="--compile.mode of both runs (a run setting: sittings may differ)")
    p.add_argument("--out", type=Path, help="pack what the next sitting needs into this folder")
    p.add_argument("--set", nargs=argparse.REMAINDER, default=[], help="more CLI arguments for both runs")
    p = sub.add_parser("unpack", help="put packed runs back into --state")
    p.add_argument("--from", dest="source", type=Path, required=True, help="a folder that sit --out wrote")
    p = sub.add_parser("report", help="the curves so far")
    p.add_argument("--every", type=int, default=10_000, help="show a validation about every this many steps")
    p.add_argument("--csv", type=Path, help="also write the curves here as a tidy CSV")
    args = parser.parse_args(argv)
    if args.command == "sit":
        if args.seconds <= 0:
            parser.error(f"--seconds {args.seconds} must be positive")
        sit(args)
    elif args.command == "unpack":
        unpack(args)
    else:
        print(report_table(args.state, args.every))
        if args.csv:
            write_curves(args.state, args.csv)


if __name__ == "__main__":
    main()

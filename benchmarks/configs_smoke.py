"""Every config survives ``--trainer.fast_dev_run true`` from an empty working folder (issue 28).

    python benchmarks/configs_smoke.py                       # every config but configs/i2cl/**, the table below
    python benchmarks/configs_smoke.py --only mmca/avmnist   # configs whose path contains one of these
    python benchmarks/configs_smoke.py --include-i2cl        # I2CL's configs too

For each YAML under ``configs/`` it runs, in a fresh empty temporary folder as the working directory and with
``OMP_NUM_THREADS=1``::

    python -m lit_icl fit --config <base> [--config <overlay> ...] --trainer.fast_dev_run true

with the configs and the subcommand of the first command in the config's own header comment that runs it
without a checkpoint (so ``test`` for the parameter-free baselines, and an overlay that stacks after another
one, such as ``coqe/regression/curriculum.yaml`` after ``cpu.yaml``, gets both); a config whose header has no
such command runs alone if a base, stacked on its base if an overlay, as the README says. Config paths are absolute, so relative paths in a config (``data/...``, ``runs/``)
resolve against that empty folder, as they would for a user who cloned elsewhere.

Stand-ins: building each from scratch in every folder costs minutes, so every temporary folder's ``data`` is a
link to one shared data folder (``--data``; by default a new empty one for the sweep, so the first config that
needs a stand-in builds it on first use and its time includes the build; the table says which). A run passes
when it exits 0; a run that exits 2 with exactly one ``lit_icl: error:`` line (the documented refusal, e.g. a
dataset only the user can supply) is recorded as stopped, with that line; anything else fails, with the last
lines of its output. The table also lists what each run left in its working folder besides ``data``.

Writes the Markdown table (``--out``, default ``experiments/results/configs_fast_dev_run_cpu.md``) naming the
command, machine, date and commit; exits 1 when any config failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
ERROR_PREFIX = "lit_icl: error:"
#: Everything from this line on in an existing results file is kept when the table is rewritten.
NOTES_MARKER = "<!-- notes: kept when benchmarks/configs_smoke.py rewrites the table above -->"
#: A command in a config's header comment.
COMMAND_LINE = re.compile(r"python -m lit_icl (fit|test)\b")


def list_configs(include_i2cl: bool = False) -> list[Path]:
    """Every YAML under ``configs/`` (relative to the repository), bases before their overlays."""
    found = sorted((p.relative_to(REPO) for p in CONFIGS.rglob("*.yaml")), key=str)
    return [p for p in found if include_i2cl or p.parts[1] != "i2cl"]


def header_command(config: Path) -> tuple[str, list[Path]] | None:
    """``(subcommand, configs)`` of the first command in ``config``'s leading comment lines that runs it
    (``python -m lit_icl fit|test ... --config <config>``, continuation lines joined), without a checkpoint;
    ``None`` when the header has none. Only the ``--config`` arguments are kept."""
    header = []
    for line in (REPO / config).read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    joined = "\n".join(header).replace("\\\n", " ")
    for line in joined.splitlines():
        match = COMMAND_LINE.search(line)
        if match is None or "--ckpt_path" in line:
            continue
        words = line[match.end():].split()
        configs = [Path(words[i + 1]) for i, w in enumerate(words[:-1]) if w == "--config"]
        if config in configs:
            return match.group(1), configs
    return None


def stack(config: Path) -> list[Path]:
    """The configs to pass, in order: as the config's own header runs it when it says (an overlay that stacks
    after another overlay, e.g. ``curriculum.yaml`` after ``cpu.yaml``); otherwise an overlay
    ``configs/<paper>/<experiment>/<variant>.yaml`` comes after its base ``configs/<paper>/<experiment>.yaml``
    and anything else runs alone."""
    found = header_command(config)
    if found is not None:
        return found[1]
    base = config.parent.with_suffix(".yaml")
    if len(config.parts) == 4 and (REPO / base).is_file():
        return [base, config]
    return [config]


def subcommand(config: Path) -> str:
    """``test`` when the config's header runs it with ``test`` and no checkpoint (a parameter-free baseline),
    else ``fit``."""
    found = header_command(config)
    return found[0] if found is not None else "fit"


def command(config: Path) -> list[str]:
    args = ["python", "-m", "lit_icl", subcommand(config)]
    for path in stack(config):
        args += ["--config", str(path)]
    return [*args, "--trainer.fast_dev_run", "true"]


def run_one(config: Path, data: Path, timeout: float, log_dir: Path | None) -> dict[str, object]:
    """Run ``config`` in a fresh temporary folder whose ``data`` links to ``data``; the outcome and its time."""
    cmd = command(config)
    absolute = [str(REPO / a) if a.startswith("configs/") else a for a in cmd]
    absolute[0] = sys.executable
    before = {p.name for p in data.iterdir()}
    with tempfile.TemporaryDirectory(prefix="configs_smoke_") as tmp:
        cwd = Path(tmp)
        (cwd / "data").symlink_to(data, target_is_directory=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(absolute, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
            rc, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            rc, out = None, f"{err.stdout or ''}{err.stderr or ''}\ntimed out after {timeout:.0f} s"
        seconds = time.perf_counter() - t0
        left = sorted(p.name + ("/" if p.is_dir() else "") for p in cwd.iterdir() if p.name != "data")
    built = sorted({p.name for p in data.iterdir()} - before)
    errors = [ln for ln in out.splitlines() if ln.startswith(ERROR_PREFIX)]
    if rc == 0:
        outcome = "passed"
    elif rc == 2 and len(errors) == 1 and "Traceback" not in out:
        outcome = f"stopped: `{errors[0]}`"
    else:
        tail = " / ".join(ln.strip() for ln in out.strip().splitlines()[-3:])
        outcome = f"FAILED (exit {rc}): {tail}"
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / (str(config).replace("/", "__") + ".log")).write_text(out)
    return {"config": config, "command": " ".join(cmd), "outcome": outcome, "seconds": seconds,
            "built": built, "left": left}


def commit(include_i2cl: bool = False) -> str:
    """The short commit, noting uncommitted changes to the code or configs the sweep runs (I2CL's only when its
    configs run: no other paper imports it)."""
    paths = ["lit_icl", "configs"] + ([] if include_i2cl else [":!lit_icl/i2cl", ":!configs/i2cl"])
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes under lit_icl/ or configs/)" if dirty else "")


def machine() -> str:
    import lightning
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{os.cpu_count()}-core CPU ({cpu}), {gpu}; Python {platform.python_version()}, torch {torch.__version__}, "
            f"lightning {lightning.__version__}")


def report(rows: list[dict[str, object]], argv: list[str], data_note: str, started: dt.datetime,
           finished: dt.datetime, head: str) -> str:
    passed = sum(r["outcome"] == "passed" for r in rows)
    stopped = sum(str(r["outcome"]).startswith("stopped") for r in rows)
    failed = len(rows) - passed - stopped
    lines = [
        "# Every config under `fast_dev_run` from an empty working folder",
        "",
        f"Command: `python benchmarks/configs_smoke.py {' '.join(argv)}`".rstrip() + " (one run per config, one at a "
        "time, each in a fresh empty temporary folder as the working directory, `OMP_NUM_THREADS=1`, config paths "
        "absolute).",
        f"Machine: {machine()}.",
        f"Date: {started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC. Commit: {head}.",
        f"Data: {data_note}",
        "",
        (f"**{passed} passed, {stopped} stopped with the documented one-line error, {failed} failed** "
         f"(of {len(rows)})."),
        "",
        ("| config | command (from the empty folder; `configs/...` passed as absolute paths) | outcome | seconds | "
         "stand-in built by this run | left in the working folder |"),
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        built = ", ".join(f"`data/{b}`" for b in r["built"]) or "-"
        left = ", ".join(f"`{x}`" for x in r["left"]) or "nothing"
        link = " (a link to `configs/coqe/omniglot.yaml`)" if (REPO / str(r["config"])).is_symlink() else ""
        lines.append(f"| `{r['config']}`{link} | `{r['command']}` | {r['outcome']} | {r['seconds']:.1f} | {built} | "
                     f"{left} |")
    return "\n".join(lines) + "\n"


def kept_notes(out: Path) -> str:
    """The hand-written notes of an existing results file (from :data:`NOTES_MARKER` on), to append to a new
    table; empty when there are none."""
    if not out.is_file() or NOTES_MARKER not in out.read_text():
        return ""
    return "\n" + NOTES_MARKER + out.read_text().split(NOTES_MARKER, 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="run configs whose path contains one of these")
    parser.add_argument("--include-i2cl", action="store_true", help="also run configs/i2cl/**")
    parser.add_argument("--data", default=None,
                        help="shared data folder every run's data/ links to (default: a new empty one, removed "
                             "after the sweep)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per config")
    parser.add_argument("--out", default="experiments/results/configs_fast_dev_run_cpu.md")
    parser.add_argument("--logs", default=None, help="folder for each run's full output")
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    configs = [c for c in list_configs(args.include_i2cl)
               if args.only is None or any(s in str(c) for s in args.only)]
    if args.list:
        print("\n".join(" ".join(command(c)) for c in configs))
        return 0
    own_data = args.data is None
    data = Path(tempfile.mkdtemp(prefix="configs_smoke_data_")) if own_data else Path(args.data).resolve()
    data.mkdir(parents=True, exist_ok=True)
    held = sorted(p.name for p in data.iterdir())
    data_note = (f"every folder's `data` links to one shared folder, {'new and empty at the start' if not held else 'holding ' + ', '.join(f'`{h}`' for h in held) + ' at the start'}"
                 f"{' (' + str(data) + ')' if not own_data else ''}; a stand-in is built on first use by the first "
                 "config that needs it (its seconds include the build) and reused by the configs after it.")
    head = commit(args.include_i2cl)
    started = dt.datetime.now(dt.timezone.utc)
    rows = []
    out = REPO / args.out
    try:
        for config in configs:
            row = run_one(config, data, args.timeout, Path(args.logs) if args.logs else None)
            print(f"{row['seconds']:7.1f} s  {row['outcome'][:100]}  {config}", flush=True)
            rows.append(row)
        finished = dt.datetime.now(dt.timezone.utc)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report(rows, argv, data_note, started, finished, head) + kept_notes(out))
        print(f"wrote {out}", flush=True)
    finally:
        if own_data:  # tens of thousands of small files (glyphs, image frames): can take a minute
            shutil.rmtree(data, ignore_errors=True)
    return int(any(str(r["outcome"]).startswith("FAILED") for r in rows))


if __name__ == "__main__":
    sys.exit(main())

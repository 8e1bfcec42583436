"""What compiling costs a run of a config: from an empty cache, then from the cache the runs before it left.

    python benchmarks/compile_cache.py --config configs/icssl/manifolds.yaml
    python benchmarks/compile_cache.py --config configs/coqe_omniglot.yaml --config configs/coqe/omniglot/cpu.yaml
    python benchmarks/compile_cache.py --config configs/icssl/manifolds.yaml --custom-functions off,on --runs 3
    python benchmarks/compile_cache.py --config configs/icssl/manifolds.yaml --mode reduce-overhead   # on a GPU

A first run of a compiled config compiles its nets from nothing; a second run, a resumed run or another seed of
the same net finds inductor's and AOTAutograd's caches on disk (``TORCHINDUCTOR_CACHE_DIR``) and should pay only
Dynamo's tracing. For each setting this runs ``python -m lit_icl fit`` ``--runs`` times, one fresh process after
the other, on one cache folder that starts empty, each run a few training steps and one short validation round
(so every graph, training and evaluation, is compiled), and prints each run's own account of its compiling (the
``lit_icl: compilation in this run`` line of :class:`~lit_icl.callbacks.compile.CompileNets`) and its wall time.
A run that read its training graph back from the caches names no backward graph compiled.

``--custom-functions off,on`` runs the whole sequence once per setting of torch's
``TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD``, which takes precedence over what the CLI's
``process_defaults`` sets (``on``): with ``off``, AOTAutograd's cache passes over a graph that applies an autograd
Function of ours (IC-SSL's nets apply two), as torch does by default.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_options import at_least

from lit_icl.callbacks.compile import COMPILATION_LINE

ROOT = Path(__file__).resolve().parents[1]
CUSTOM_FUNCTIONS_ENV = "TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD"


def fit_command(configs: list[str], mode: str, steps: int, val_batches: int, out: Path,
                extra: list[str] | None = None) -> list[str]:
    """The short run timed: ``steps`` training steps, one validation round of ``val_batches`` batches."""
    return [sys.executable, "-m", "lit_icl", "fit", *[a for c in configs for a in ("--config", c)],
            "--compile.mode", mode, "--trainer.max_steps", str(steps),
            "--trainer.val_check_interval", str(steps), "--trainer.limit_val_batches", str(val_batches),
            "--trainer.num_sanity_val_steps", "0", "--trainer.check_val_every_n_epoch", "null",
            "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
            "--trainer.default_root_dir", str(out), *(extra or [])]


def compile_line(output: str) -> str | None:
    """What the run said it compiled, without the line's prefix; ``None`` if it said nothing (it failed, or ran
    eager)."""
    for line in output.splitlines():
        if line.startswith(COMPILATION_LINE):
            return line[len(COMPILATION_LINE):].lstrip(": ")
    return None


def report_line(label: str, run: int, said: str, wall: float) -> str:
    """One run's line: its setting, its number (from 0) and the cache it started from, what it compiled."""
    cache = "empty cache" if run == 0 else f"cache left by run{'s 1-' if run > 1 else ' '}{run}"
    return f"{label}, run {run + 1} ({cache}): {said}; {wall:.1f} s of wall time"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--mode", default="default", help="--compile.mode of the runs (default: default)")
    parser.add_argument("--runs", type=at_least(1), default=3,
                        help="runs per setting, the first from an empty cache")
    parser.add_argument("--steps", type=at_least(1), default=4, help="training steps per run")
    parser.add_argument("--val-batches", type=at_least(1), default=2,
                        help="batches of the run's one validation round")
    parser.add_argument("--custom-functions", default=None, metavar="off,on",
                        help=f"run the sequence once per setting of {CUSTOM_FUNCTIONS_ENV} (default: as the CLI)")
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument, e.g. --set=--compile.backend=aot_eager")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    args = parser.parse_args(argv)
    if args.mode == "off":
        parser.error("--mode off compiles nothing; name a compile mode")
    settings: list[str | None] = [None]
    if args.custom_functions is not None:
        settings = [s.strip() for s in args.custom_functions.split(",")]
        if not settings or any(s not in ("off", "on") for s in settings):
            parser.error("--custom-functions takes off, on or off,on")

    print("$ python benchmarks/compile_cache.py " + " ".join(sys.argv[1:] if argv is None else argv), flush=True)
    failed = False
    for setting in settings:
        label = "as the CLI sets it" if setting is None else f"{CUSTOM_FUNCTIONS_ENV}={int(setting == 'on')}"
        with tempfile.TemporaryDirectory(prefix="compile_cache_") as tmp:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "cache"))
            if setting is not None:
                env[CUSTOM_FUNCTIONS_ENV] = "1" if setting == "on" else "0"
            for i in range(args.runs):
                out = Path(tmp) / f"run{i}"
                start = time.perf_counter()
                proc = subprocess.run(fit_command(args.config, args.mode, args.steps, args.val_batches, out, args.set),
                                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout,
                                      check=False)
                wall = time.perf_counter() - start
                said = compile_line(proc.stdout + proc.stderr)
                if proc.returncode != 0 or said is None:
                    failed = True
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                    print(f"{label}, run {i + 1}: failed (exit {proc.returncode}): {tail[0]}", flush=True)
                    break
                print(report_line(label, i, said, wall), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Every GPU number the project promises, in one command, written to ``experiments/results/gpu_<date>.md``.

    python benchmarks/gpu_suite.py                       # on a machine with one CUDA GPU (about 20-30 minutes)
    python benchmarks/gpu_suite.py --dry-run --out /tmp/gpu_dry.md    # the same steps on the CPU, tiny, seconds

Steps (each a subprocess of a script in ``benchmarks/``, so each can be rerun alone with the command shown in
the report):

- the main command all-in for a fixed wall time (validation and checkpoints included), with CUDA graphs
  (``--compile.mode reduce-overhead``) and eager, then with CUDA graphs in bf16-mixed and channels-last, and
  IC-SSL's manifolds config the same way (``benchmarks/main_command.py``); both again with their batches made
  by two DataLoader workers instead of the training process;
- 20 steps of each of those two runs under the profiler, after warm-up: host time of the step, its backward and
  its update, with the CUDA graph launches, kernel launches and waits in each (``--trace``,
  ``benchmarks/step_trace.py``);
- batched ``eigh`` of IC-SSL's 100-point Laplacians on the GPU vs the host route it takes
  (``benchmarks/eigh_route.py``);
- what DDP ranks pay per step to agree on SIGTERM, Lightning's broadcast against the CLI's host vote, on two ranks
  sharing the GPU (``benchmarks/ddp_stop_vote.py``);
- each paper's training step eager, compiled and CUDA-graph-captured, Lightning vs a bare loop of the same
  step, deterministic kernels on and off (``benchmarks/step_speed.py``);
- the tests marked ``cuda`` (GPU-only code paths that the CPU test suite skips), and as ``cuda_tests_rest`` the
  ones its short form leaves out;
- IC-SSL: Lightning vs a bare loop over the same net and data, deterministic kernels on and off (what
  reproducibility costs on CUDA);
- CoQE Omniglot at the paper's size (105x105 images, CoQE E = 512 / L = 4, Transformer E = 64 / L = 12, batch
  24): Lightning vs bare, fp32 and bf16-mixed, and the projected time to the paper's 10^5 steps;
- CoQE regression (App. C.1 sizes): Lightning vs bare, and our Transformer vs HuggingFace GPT-2 when
  ``transformers`` is installed;
- I2CL: its calibration step eager vs compiled with CUDA graphs (compile time, ms per step, steps to break
  even; ``benchmarks/i2cl_compile.py``, on SmolLM2-135M's config with random weights), and latency per query of
  zero-shot, I2CL, task vector and few-shot ICL in bf16 on both offline models, SmolLM2-135M and Gemma 3 270M
  (each skipped, with the reason, when not installed: ``docs/i2cl.md``).

The report names the device, torch version, date, commit and every command, and what a unit of host work
costs on that machine (a Python call, a small torch op on the CPU and on the GPU), tabulates the speed goals its steps
measured (met or not), and keeps each script's output verbatim; a step that fails or times out is reported as such (with its last lines) and the suite goes on. The
per-step time limits add up to 120 minutes. With less GPU time (say 10 minutes), name the steps wanted most
with ``--only``, take their short forms with ``--short`` (fewer modes and steps, the same code paths) and cap
the whole suite with ``--budget``; the report is rewritten after each step:

    python benchmarks/gpu_suite.py --short --budget 520 \
        --only main_command_workers,main_command,icssl_cli_workers,icssl_cli,eigh_route,cuda_tests
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_options import more_than

# blas_host.py is beside this script (its directory is on sys.path when it runs): one timing loop for both.
from blas_host import per_call_us

ROOT = Path(__file__).resolve().parents[1]
PAPER_STEPS = 100_000  # CoQE App. C.2: 10^5 training steps
#: Seconds a step has, after SIGTERM at its limit, to report what it measured before it is killed.
TERM_GRACE_S = 30


@dataclass(frozen=True)
class Step:
    name: str
    measures: str
    gpu: list[str]  # arguments of the script on a GPU
    dry: list[str]  # arguments of a seconds-long CPU run of the same code path
    timeout_s: int
    needs: str | None = None  # a path (relative to the repo) without which the step is skipped
    short: list[str] | None = None  # the GPU arguments of --short (a lease's minutes), where they differ

    def argv(self, dry: bool, short: bool) -> list[str]:
        """The script and arguments of this step: the CPU dry run, the short GPU run, or the full GPU run."""
        if dry:
            return self.dry
        return self.short if short and self.short else self.gpu

    @property
    def script(self) -> str:
        return self.gpu[0]


#: A seconds-long CPU run of step_speed.py (the dry runs of the step-speed steps).
_DRY_SPEED = ["--device", "cpu", "--modes", "off,default", "--backend", "aot_eager", "--steps", "3", "--warmup", "1"]
#: What the dry runs of main_command.py change: a tiny, short run.
_DRY_ICSSL = ["--set=--model.init_args.net.init_args.representation.init_args.n_points=20",
              "--set=--data.init_args.n_points=20", "--set=--data.init_args.train_batches_per_epoch=5",
              "--set=--data.init_args.val_episodes=64", "--set=--trainer.log_every_n_steps=1"]


#: The settings icssl_variants changes, one per run, against the config as shipped.
_ICSSL_VARIANTS = ["--variant=shipped=", "--variant=no-validation=--trainer.limit_val_batches=0",
                   "--variant=nondeterministic=--trainer.deterministic=false",
                   "--variant=workers-2=--data.init_args.num_workers=2"]


def _speed(name: str, configs: list[str], measures: str, dry: list[str], timeout_s: int,
           needs: str | None = None) -> Step:
    """A step_speed.py step: eager vs compiled vs CUDA graphs, Lightning vs bare, deterministic on and off.

    Its short form keeps what the goals are judged by: eager and CUDA graphs, Lightning and bare, deterministic
    on and off, over fewer steps (plain ``default`` compilation costs a compile and is never the fastest)."""
    files = [a for c in configs for a in ("--config", c)]
    gpu = ["benchmarks/step_speed.py", *files, "--device", "cuda"]
    return Step(name, measures,
                [*gpu, "--modes", "off,default,reduce-overhead", "--deterministic", "true,false", "--steps", "300",
                 "--warmup", "60"],
                ["benchmarks/step_speed.py", *files, *_DRY_SPEED, *dry], timeout_s, needs=needs,
                short=[*gpu, "--modes", "reduce-overhead,off", "--deterministic", "true,false", "--steps", "200",
                       "--warmup", "50"])


def _main_command_variant(name: str, what: str, setting: str) -> Step:
    """The main command all-in with CUDA graphs and one setting changed (``setting``, a ``--set=`` argument)."""
    return Step(name, f"the main command all-in with CUDA graphs, {what}",
                ["benchmarks/main_command.py", "--modes", "reduce-overhead", "--seconds", "100", "--skip", "40",
                 setting],
                ["benchmarks/main_command.py", "--config", "configs/coqe/omniglot.yaml", "--config",
                 "configs/coqe/omniglot/cpu.yaml", "--modes", "off", "--seconds", "15", "--skip", "0",
                 "--set=--trainer.log_every_n_steps=1", "--set=--trainer.val_check_interval=5",
                 "--set=--data.init_args.val_sequences=32", "--set=--model.init_args.net.init_args.depth=1", setting],
                240,
                short=["benchmarks/main_command.py", "--modes", "reduce-overhead", "--seconds", "110", "--skip", "30",
                       setting])


STEPS = [
    # What the speed issue's goals are judged by come first: the main command and IC-SSL's CLI run all-in,
    # compiled with CUDA graphs and eager, then each paper's step under each compile mode.
    Step("main_command", "the main command all-in (validation, checkpoints) for 100 s: CUDA graphs, then eager",
         ["benchmarks/main_command.py", "--modes", "reduce-overhead,off", "--seconds", "100", "--skip", "40",
          "--phases"],
         ["benchmarks/main_command.py", "--config", "configs/coqe/omniglot.yaml", "--config",
          "configs/coqe/omniglot/cpu.yaml", "--modes", "off", "--seconds", "15", "--skip", "0",
          "--set=--trainer.log_every_n_steps=1", "--set=--trainer.val_check_interval=5",
          "--set=--data.init_args.val_sequences=32", "--set=--model.init_args.net.init_args.depth=1", "--phases"], 300,
         # Short: CUDA graphs only (eager was measured at 27 steps/s); compiling takes about 40 s of the run, and
         # what is left spans several validation rounds (1,000 steps each).
         short=["benchmarks/main_command.py", "--modes", "reduce-overhead", "--seconds", "110", "--skip", "30",
                "--phases"]),
    Step("icssl_cli", "IC-SSL's manifolds config through the CLI all-in for 90 s, CUDA graphs",
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "reduce-overhead",
          "--seconds", "90", "--skip", "40", "--phases"],
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "off",
          "--seconds", "15", "--skip", "0", "--phases", *_DRY_ICSSL], 180,
         # Short: an epoch is 250 steps, so 55 s still hold many validation rounds after compiling.
         short=["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes",
                "reduce-overhead", "--seconds", "55", "--skip", "15", "--phases"]),
    _speed("step_speed_icssl", ["configs/icssl/manifolds.yaml"],
           "IC-SSL step: eager / compiled / CUDA graphs, Lightning vs bare, deterministic on and off", [], 300),
    _speed("step_speed_coqe", ["configs/coqe/omniglot.yaml"],
           "CoQE (paper size) step: eager / compiled / CUDA graphs, Lightning vs bare, deterministic on and off",
           ["--config", "configs/coqe/omniglot/cpu.yaml"], 420),
    # Which part of the CLI run costs IC-SSL's steps what the step alone does not (37.5 steps/s all-in on
    # 2026-11-28 against 182.8 for the step through Lightning with batches made ahead): the same run as shipped and
    # with one thing changed at a time, each compiled from inductor's cache after the first.
    Step("icssl_variants", "IC-SSL's manifolds config through the CLI with CUDA graphs, as shipped and with one "
         "setting changed at a time: no validation, deterministic kernels off, 2 DataLoader workers",
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "reduce-overhead",
          "--seconds", "35", "--skip", "12", *_ICSSL_VARIANTS],
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "off",
          "--seconds", "10", "--skip", "0", *_DRY_ICSSL, *_ICSSL_VARIANTS], 300),
    # IC-SSL's captured step alone, as the CLI compiles it now (the net and its loss as one region), through
    # Lightning and in a bare loop with batches made ahead: what icssl_variants' runs are measured against.
    Step("step_speed_icssl_graphs", "IC-SSL's step alone with CUDA graphs, Lightning vs bare, deterministic on and "
         "off (step_speed_icssl without its eager runs), with the median of each stage of the Lightning runs",
         ["benchmarks/step_speed.py", "--config", "configs/icssl/manifolds.yaml", "--device", "cuda", "--modes",
          "reduce-overhead", "--deterministic", "true,false", "--steps", "300", "--warmup", "60", "--phases"],
         ["benchmarks/step_speed.py", "--config", "configs/icssl/manifolds.yaml", *_DRY_SPEED, "--phases"], 180),
    # Where a step's host time goes inside the CLI run, after compiling and the first validation round: per step,
    # the host time of the step, of its backward and of its update, and the CUDA graph launches, kernel launches
    # and waits in each (a captured step replays its graphs; a graph run uncaptured launches its kernels).
    Step("trace_icssl", "IC-SSL's manifolds config through the CLI with CUDA graphs, 20 steps after the first "
         "validation round and the second round under the profiler: host time, graph and kernel launches and waits "
         "per step and per validation batch; then 5 steps with Python calls recorded: each stage's functions by self "
         "time",
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "reduce-overhead",
          "--seconds", "70", "--skip", "15", "--trace", "400:20", "--trace-val", "2", "--trace-python", "440:5"],
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "off",
          "--seconds", "15", "--skip", "0", "--trace", "6:3", "--trace-val", "2", "--trace-python", "11:2",
          *_DRY_ICSSL], 160),
    # The main command validates every 1,000 steps; steps 300-319 come after compiling and warming up, and the
    # second validation round (after step 2,000) after the first has compiled and recorded the evaluation graphs.
    Step("trace_main", "the main command with CUDA graphs the same way, 20 steps after warm-up (steps 300-319) and "
         "its second validation round",
         ["benchmarks/main_command.py", "--modes", "reduce-overhead", "--seconds", "75", "--skip", "15", "--trace",
          "300:20", "--trace-val", "2", "--trace-python", "340:5"],
         ["benchmarks/main_command.py", "--config", "configs/coqe/omniglot.yaml", "--config",
          "configs/coqe/omniglot/cpu.yaml", "--modes", "off", "--seconds", "15", "--skip", "0",
          "--set=--trainer.log_every_n_steps=1", "--set=--trainer.val_check_interval=5",
          "--set=--data.init_args.val_sequences=32", "--set=--model.init_args.net.init_args.depth=1",
          "--trace", "7:3", "--trace-val", "2", "--trace-python", "11:2"], 180),
    # IC-SSL's EIG reference and EIG baselines solve a batch of 100 x 100 Laplacians; torch's CUDA eigh loops over
    # such a batch, so symmetric_eigenvectors solves it on the host. This times both routes.
    Step("eigh_route", "batched eigh of 100-point Laplacians: on the GPU vs the host route IC-SSL takes",
         ["benchmarks/eigh_route.py", "--device", "cuda"],
         ["benchmarks/eigh_route.py", "--device", "cpu", "--batches", "8", "--repeats", "1"], 30),
    # Lightning sends each batch with non_blocking=True; from pageable memory CUDA may still make the host wait for
    # the queue. The loaders pin on CUDA (lit_icl.core.transfer); this says whether that mattered on this driver.
    Step("h2d_copy", "copies to the GPU behind 20 ms of queued work: does the host wait, pageable vs pinned memory",
         ["benchmarks/h2d_copy.py", "--device", "cuda"],
         ["benchmarks/h2d_copy.py", "--device", "cpu", "--repeats", "1"], 30),
    # What a matrix product launched from Python costs the host (cuBLAS and cuBLASLt, deterministic on and off):
    # what IC-SSL's 240 products per step cost wherever they run outside a CUDA graph.
    Step("blas_host", "host time per small matrix product launched from Python (IC-SSL's shapes), by BLAS library "
         "and deterministic setting, against one elementwise kernel",
         ["benchmarks/blas_host.py", "--device", "cuda"],
         ["benchmarks/blas_host.py", "--device", "cpu", "--calls", "20"], 60),
    # Under DDP Lightning 2.6 makes the ranks agree on SIGTERM before every batch, reading a flag back from the GPU;
    # the CLI replaces that by a vote on the host (lit_icl.callbacks.StopTogether). Both, on two ranks sharing the GPU.
    Step("ddp_stop_vote", "DDP's per-step SIGTERM agreement: Lightning's broadcast vs the host vote, 2 gloo ranks on one GPU",
         ["benchmarks/ddp_stop_vote.py", "--device", "cuda"],
         ["benchmarks/ddp_stop_vote.py", "--device", "cpu", "--steps", "20", "--warmup", "2"], 60),
    # The main command's fp32 step is GPU-bound under CUDA graphs (11 ms, 2026-11-27): less work per step is the
    # way past 100 steps/s. bf16 changes the numbers, so it is measured here, not made the default.
    _main_command_variant("main_command_bf16", "in bf16-mixed (less GPU work per step)",
                          "--set=--trainer.precision=bf16-mixed"),
    _main_command_variant("main_command_channels_last", "its ResNet channels-last (NHWC)",
                          "--set=--model.init_args.net.init_args.channels_last=true"),
    # cuDNN picks convolution algorithms by heuristics unless told to time them; the ResNet's 29 convolutions are
    # a large share of the step's GPU time (2026-11-26 profile). The choice can differ between runs, and with it
    # the rounding, so it stays opt-in (Lightning's --trainer.benchmark).
    _main_command_variant("main_command_cudnn_benchmark", "cuDNN's convolution autotuner on",
                          "--set=--trainer.benchmark=true"),
    # Under CUDA graphs inductor runs each convolution and matrix product through a library kernel picked by
    # heuristics; max-autotune times Triton templates against them for each shape (minutes of compiling, kept in
    # inductor's cache) and captures CUDA graphs too. Rounding differs with the kernels chosen, as with any compile.
    Step("main_command_max_autotune", "the main command all-in with --compile.mode max-autotune (each convolution "
         "and product's kernel timed at compile time; CUDA graphs)",
         ["benchmarks/main_command.py", "--modes", "max-autotune", "--seconds", "280", "--skip", "60"],
         ["benchmarks/main_command.py", "--config", "configs/coqe/omniglot.yaml", "--config",
          "configs/coqe/omniglot/cpu.yaml", "--modes", "off", "--seconds", "15", "--skip", "0",
          "--set=--trainer.log_every_n_steps=1", "--set=--trainer.val_check_interval=5",
          "--set=--data.init_args.val_sequences=32", "--set=--model.init_args.net.init_args.depth=1"], 440),
    # Which kernels make the main command's GPU-bound step, under CUDA graphs and eager (the next thing to cut).
    Step("profile_coqe", "CoQE's step (paper size) under the profiler: kernels per step and the kernels that take "
         "the GPU time, CUDA graphs and eager",
         ["benchmarks/profile_step.py", "--config", "configs/coqe/omniglot.yaml", "--device", "cuda", "--modes",
          "reduce-overhead,off", "--steps", "70", "--warmup", "50"],
         ["benchmarks/profile_step.py", "--config", "configs/coqe/omniglot.yaml", "--config",
          "configs/coqe/omniglot/cpu.yaml", "--device", "cpu", "--modes", "off", "--steps", "3", "--warmup", "1",
          "--set=--model.init_args.net.init_args.depth=1"], 180),
    Step("profile_icssl", "IC-SSL's step under the profiler the same way",
         ["benchmarks/profile_step.py", "--config", "configs/icssl/manifolds.yaml", "--device", "cuda", "--modes",
          "reduce-overhead,off", "--steps", "70", "--warmup", "50"],
         ["benchmarks/profile_step.py", "--config", "configs/icssl/manifolds.yaml", "--device", "cpu", "--modes",
          "off", "--steps", "3", "--warmup", "1", *_DRY_ICSSL], 150),
    # A first run compiles from nothing (IC-SSL's: 29 s under CUDA graphs on an H200, 2026-11-28); a second run,
    # a resumed sitting or another seed reads inductor's and AOTAutograd's caches. GPU times from a warm cache
    # have not been measured.
    Step("compile_cache_icssl", "IC-SSL's manifolds config compiled with CUDA graphs from an empty cache, then "
         "twice from the cache it left: what a first run and each later run pay",
         ["benchmarks/compile_cache.py", "--config", "configs/icssl/manifolds.yaml", "--mode", "reduce-overhead",
          "--runs", "3"],
         ["benchmarks/compile_cache.py", "--config", "configs/icssl/manifolds.yaml", "--runs", "1",
          "--set=--compile.backend=aot_eager", *_DRY_ICSSL], 240,
         short=["benchmarks/compile_cache.py", "--config", "configs/icssl/manifolds.yaml", "--mode",
                "reduce-overhead", "--runs", "2"]),
    # The main command makes its batches in the training process by default (1.4 ms a batch on our CPU machine).
    _main_command_variant("main_command_workers", "batches made by 2 persistent DataLoader workers",
                          "--set=--data.init_args.num_workers=2"),
    # IC-SSL makes its episodes in the training process by default; at GPU rates that is a share of the step.
    Step("icssl_cli_workers", "IC-SSL's manifolds config through the CLI as icssl_cli, episodes made by 2 persistent "
         "DataLoader workers",
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "reduce-overhead",
          "--seconds", "90", "--skip", "40", "--set=--data.init_args.num_workers=2"],
         ["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes", "off",
          "--seconds", "15", "--skip", "0", *_DRY_ICSSL, "--set=--data.init_args.num_workers=2"], 180,
         short=["benchmarks/main_command.py", "--config", "configs/icssl/manifolds.yaml", "--modes",
                "reduce-overhead", "--seconds", "55", "--skip", "15",
                "--set=--data.init_args.num_workers=2"]),
    _speed("step_speed_coqe_transformer", ["configs/coqe/omniglot.yaml", "configs/coqe/omniglot/transformer.yaml"],
           "the Transformer baseline (E = 64, L = 12) the same way", ["--config", "configs/coqe/omniglot/cpu.yaml"],
           210),
    _speed("step_speed_coqe_regression", ["configs/coqe/regression.yaml"],
           "CoQE regression step the same way", [], 180),
    _speed("step_speed_mmca_synthetic", ["configs/mmca/synthetic.yaml"],
           "multi-modal synthetic step the same way", [], 180),
    _speed("step_speed_mmca_avmnist", ["configs/mmca/avmnist.yaml"],
           "avMNIST step the same way (needs its stand-in)", [], 180, needs="data/avmnist_lite"),
    # Tests marked `cuda` exercise code paths that only a GPU reaches (devices of tensors that Lightning moves);
    # the CPU test suite skips them; the dry run only collects them. Six of them compile a paper's nets with CUDA
    # graphs (tens of seconds of compiling each), hence the limit.
    Step("cuda_tests", "the tests marked `cuda` (skipped on the CPU): GPU-only code paths",
         # -v names each test as it ends, so a run cut by the lease still says which passed.
         ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "cuda", "tests"],
         ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "--collect-only", "tests"], 420,
         # Short: all but CoQE regression's and the multi-modal runs, whose steps have the same structure (the net
         # and its loss as one compiled objective) as IC-SSL's and the main command's, which stay, and the seeded
         # pairs of runs that check reproducibility (two fits each).
         short=["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "cuda", "-k",
                "not coqe_regression and not mmca and not seeded", "tests"]),
    # What the short form of cuda_tests leaves out, for a lease after one that ran the short form.
    Step("cuda_tests_rest", "the `cuda` tests that cuda_tests' short form leaves out: CoQE regression's and the "
         "multi-modal modules' GPU paths, and two seeded runs per paper that must end bit-identical",
         ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "cuda", "-k", "coqe_regression or mmca or seeded",
          "tests"],
         ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-k", "coqe_regression or mmca or seeded",
          "--collect-only", "tests"], 420),
    Step("coqe_omniglot_fp32", "CoQE / Transformer steps/s at the paper's size, fp32 (and the sequence generator)",
         ["benchmarks/coqe_throughput.py", "--device", "cuda", "--steps", "100", "--precision", "32-true"],
         ["benchmarks/coqe_throughput.py", "--device", "cpu", "--steps", "2", "--image-size", "28", "--only",
          "train", "--nets", "coqe"], 180),  # 37 s on an H200 (2026-11-26)
    Step("coqe_omniglot_bf16", "the same training steps in bf16-mixed",
         ["benchmarks/coqe_throughput.py", "--device", "cuda", "--steps", "100", "--precision", "bf16-mixed",
          "--only", "train"],
         ["benchmarks/coqe_throughput.py", "--device", "cpu", "--steps", "2", "--image-size", "28", "--only",
          "train", "--nets", "coqe", "--precision", "bf16-mixed"], 180),  # 49 s on an H200 (2026-11-26)
    Step("coqe_regression", "CoQE regression steps/s, Lightning vs bare; ours vs HuggingFace GPT-2",
         ["benchmarks/coqe_regression_throughput.py", "--device", "cuda", "--steps", "200", "--warmup", "20"],
         ["benchmarks/coqe_regression_throughput.py", "--device", "cpu", "--steps", "2", "--warmup", "1",
          "--repeats", "1", "--only", "train", "--points", "11", "--dims", "5"], 240),
    # 100 queries per method take seconds on a GPU; the limits cover loading each model
    Step("i2cl_latency_bf16", "I2CL latency per query vs zero-shot and few-shot ICL (bf16 on a GPU), SmolLM2-135M",
         ["benchmarks/i2cl_latency.py", "--queries", "100"],
         ["benchmarks/i2cl_latency.py", "--queries", "2"], 120,
         needs="data/i2cl/smollm2-135m-instruct"),
    # Random weights of SmolLM2's config: the timing does not depend on them, and its config and tokenizer files
    # travel to a GPU machine where its 538 MB of weights do not.
    Step("i2cl_compile", "I2CL's calibration step eager vs compiled (CUDA graphs): compile time, ms per step, "
         "steps to break even (SmolLM2-135M's config, random weights, bf16)",
         ["benchmarks/i2cl_compile.py", "--random-weights", "--modes", "off,reduce-overhead,default", "--steps", "60",
          "--warmup", "15", "--prompts", "i2cl,icl_i2cl"],
         ["benchmarks/i2cl_compile.py", "--random-weights", "--modes", "off,default", "--backend", "aot_eager",
          "--steps", "3", "--warmup", "1"], 420, needs="data/i2cl/smollm2-135m-instruct/config.json",
         short=["benchmarks/i2cl_compile.py", "--random-weights", "--modes", "off,reduce-overhead", "--steps", "40",
                "--warmup", "10"]),
    Step("i2cl_latency_bf16_gemma", "the same on Gemma 3 270M (post-norm blocks)",
         ["benchmarks/i2cl_latency.py", "--queries", "100", "--model", "data/i2cl/gemma-3-270m"],
         ["benchmarks/i2cl_latency.py", "--queries", "2", "--model", "data/i2cl/gemma-3-270m"], 120,
         needs="data/i2cl/gemma-3-270m"),
]
assert sum(step.timeout_s for step in STEPS) <= 120 * 60


def headline(step: Step, output: str) -> str:
    """The numbers a reader wants from one step's output, or '' when its lines are not found."""
    if step.gpu[:2] == ["-m", "pytest"]:  # pytest's summary line, e.g. "1 passed, 2 warnings in 5.22s"
        found = re.findall(r"^=*\s*(\S*\d.*(?:passed|failed|error|skipped|collected).* in [\d.]+s)\s*=*$", output,
                           re.MULTILINE)
        if found:
            return found[-1]
        # Stopped before its summary: what -v reported so far.
        ended = re.findall(r"::\S+ (PASSED|FAILED|ERROR|SKIPPED)", output)
        counts = {word.lower(): ended.count(word) for word in ("PASSED", "FAILED", "ERROR", "SKIPPED") if word in ended}
        return ("stopped after " + ", ".join(f"{n} {w}" for w, n in counts.items())) if counts else ""
    if step.script.endswith("main_command.py"):
        found = re.findall(r"^mode=(\S+)\s*:\s+([\d.]+) steps/s all-in.*?10\^5 steps would take (\d+) min", output,
                           re.MULTILINE)
        steady = dict(re.findall(r"^mode=(\S+)\s*:\s+([\d.]+) steps/s between", output, re.MULTILINE))
        text = ", ".join(f"{mode}: {sps} steps/s all-in (10^5 steps in {mins} min"
                         + (f"; {steady[mode]} between validations)" if mode in steady else ")")
                         for mode, sps, mins in found)
        # --trace: each traced range's host time and launches per step.
        traced = re.findall(r"^mode=(\S+)\s*: trace: (?:validation round \d+: )?"
                            r"(step|backward|update|val_batch|between steps|between batches): ([\d.]+) ms of host time "
                            r"per \w+(?: \([^)]*\))?; per \w+ ([\d.]+) CUDA graph launches, ([\d.]+) kernel launches",
                            output, re.MULTILINE)
        parts = [f"{mode} {name} {ms} ms host, {graphs} graph / {kernels} kernel launches"
                 for mode, name, ms, graphs, kernels in traced]
        # What the allocators did in the window: allocations from CUDA rather than from their caches.
        parts += [f"{mode} {what}" for mode, what in re.findall(
            r"^mode=(\S+)\s*: trace: (?:validation round \d+: )?(allocators per \w+: .*)$", output, re.MULTILINE)]
        return "; ".join(filter(None, [text, *parts]))
    if step.script.endswith("step_speed.py"):
        rates = re.findall(r"^(lightning|bare)\s+mode=(\S+)\s+deterministic=true\s*:\s+([\d.]+|nan) steps/s", output,
                           re.MULTILINE)
        ratios = re.findall(r"^ratio lightning/bare mode=(\S+) deterministic=true: ([\d.]+)", output, re.MULTILINE)
        text = ", ".join(f"{path} {mode} {sps}" for path, mode, sps in rates if path == "lightning")
        return text + ("; lightning/bare " + ", ".join(f"{m} {r}" for m, r in ratios) if ratios else "")
    if step.script.endswith("profile_step.py"):
        found = re.findall(r"^mode=(\S+): [\d.]+ ms of wall time per step.*\n  (?:kernels|aten ops[^:]*): (\d+) per step, "
                           r"([\d.]+) ms per step", output, re.MULTILINE)
        return ", ".join(f"{mode}: {n} kernels, {ms} ms per step" for mode, n, ms in found)
    if step.script.endswith("compile_cache.py"):
        found = re.findall(r"^.*?run (\d+) \((.*?)\): (\d+) graphs? compiled \(([\d.]+) s\)(?:, (\d+) backward graphs? "
                           r"compiled \(([\d.]+) s\))?.*; ([\d.]+) s of wall time$", output, re.MULTILINE)
        return ", ".join(f"run {run} ({cache}) {graphs} graphs {gs} s"
                         + (f" + {bwd} backward {bs} s" if bwd else ", no backward compiled") + f", {wall} s wall"
                         for run, cache, graphs, gs, bwd, bs, wall in found)
    if step.script.endswith("eigh_route.py"):
        found = re.findall(r"^eigh (\(.*?\)) float32: on the device ([\d.]+) ms, "
                           r"symmetric_eigenvectors \((\w+) route\) ([\d.]+) ms", output, re.MULTILINE)
        return ", ".join(f"{shape}: device {dev} ms, {route} route {routed} ms" for shape, dev, route, routed in found)
    if step.script.endswith("h2d_copy.py"):
        found = re.findall(r"^copy (.+?): pageable non-blocking ([\d.]+) ms, (?:pinned non-blocking ([\d.]+) ms, )?.*"
                           r"waited for the queue: (\S+)$", output, re.MULTILINE)
        if not any(w in ("yes", "no") for *_, w in found):
            return "no GPU: no queue to wait for"
        waited = [size for size, _, _, w in found if w == "yes"]
        pinned = [float(p) for _, _, p, _ in found if p]
        text = "pageable copies waited at " + (", ".join(waited) if waited else "no size")
        return text + (f"; pinned copies took at most {max(pinned):.3f} ms of host time" if pinned else "")
    if step.script.endswith("blas_host.py"):
        found = re.findall(r"^blas=(\S+) deterministic=(\w+) (bmm 64x100x100 @ 64x100x4|add 8 floats)[^:]*: "
                           r"host ([\d.]+) us per call", output, re.MULTILINE)
        return ", ".join(f"{lib}{' deterministic' if det == 'true' else ''} {op.split()[0]} {us} us"
                         for lib, det, op, us in found)
    if step.script.endswith("ddp_stop_vote.py"):
        found = re.findall(r"^boundary (\w+): ([\d.]+) steps/s, boundary host time (\d+) us", output, re.MULTILINE)
        return ", ".join(f"{variant} {rate} steps/s ({us} us at the boundary)" for variant, rate, us in found)
    if step.script.endswith("i2cl_compile.py"):
        found = re.findall(r"^mode=(\S+)\s*:\s+([\d.]+) ms/step steady,\s+([\d.-]+) s more", output, re.MULTILINE)
        even = re.findall(r"^mode=(\S+): ([\d.]+)x eager per step; compilation pays for itself after (.*)$", output,
                          re.MULTILINE)
        return ", ".join(f"{m} {ms} ms/step (+{s} s)" for m, ms, s in found) + (
            "; " + ", ".join(f"{m} {x}x, break-even {e}" for m, x, e in even) if even else "")
    if step.script.endswith("i2cl_latency.py"):
        rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \|$", output, re.MULTILINE)
        return ", ".join(f"{m} {ms} ms ({ratio} x zero-shot)" for m, ms, ratio in rows)
    # The two CoQE scripts print a block per net: "<net>: ...parameters" then indented timing lines.
    parts = []
    for net, body in re.findall(r"^(\S.*?): [\d.]+M parameters\n((?:  .*\n?)+)", output, re.MULTILINE):
        lit = re.search(r"Lightning :\s+([\d.]+) steps/s \(([\d.]+) x bare\)", body)
        if lit:
            text = f"{net}: Lightning {lit.group(1)} steps/s ({lit.group(2)} x bare)"
            if step.name.startswith("coqe_omniglot") and float(lit.group(1)) > 0:
                text += f", 10^5 steps in {PAPER_STEPS / float(lit.group(1)) / 3600:.1f} h"
            parts.append(text)
    parts += [" ".join(ln.split()) for ln in output.splitlines() if ln.strip().startswith("ours / HF")]
    return "; ".join(parts)


def run_step(step: Step, dry: bool, short: bool = False, limit_s: float | None = None) -> dict[str, object]:
    """Run one step (at most ``limit_s`` seconds, else its own limit); its status, wall time, output, command."""
    if step.needs and not (ROOT / step.needs).exists():
        return {"status": f"skipped: {step.needs} is not installed", "seconds": 0.0, "output": "", "cmd": ""}
    timeout_s = step.timeout_s if limit_s is None else max(1, int(min(step.timeout_s, limit_s)))
    argv = [sys.executable, *step.argv(dry, short)]
    cmd = " ".join(["python", *argv[1:]])
    # The scripts import lit_icl; this checkout's copy, whether or not it is the one installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.time()
    # A session of its own, so that a step that runs past its limit is stopped with every process it started
    # (main_command.py runs the CLI in a child process, which would otherwise hold the GPU after the step).
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        ok = proc.returncode == 0
        # stdout holds the numbers; stderr (Lightning's banners, warnings) is kept only to explain a failure.
        output, status = stdout if ok else stdout + stderr, "ok" if ok else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        # SIGTERM first: main_command.py then stops its run and reports the rate so far; SIGKILL after a grace.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        output = stdout + stderr  # what it printed before the limit, to show where it was
        status = f"timed out after {timeout_s} s"
    return {"status": status, "seconds": time.time() - start, "output": output, "cmd": cmd}


def device_line(dry: bool) -> str:
    if not dry and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return f"{torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    return f"CPU only ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def cpu_model() -> str:
    """The host CPU's model name (Linux's ``/proc/cpuinfo``), or what ``platform`` says elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_line(dry: bool) -> str:
    """What one unit of host work costs on this machine, to set its steps' host times against another's: a Python
    call, a torch op on a small CPU tensor (dispatch, no arithmetic to speak of), and, with a GPU, an op on a small
    GPU tensor (dispatch and a kernel launch, the device idle). Measured in about a second; a host several times
    slower per call makes every eager op, Lightning hook and batch built in the process as much slower."""

    def nothing() -> None:
        return None

    a = torch.ones(8)
    parts = [f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
             f"{per_call_us(nothing, 100_000)[1] * 1e3:.0f} ns per Python call",
             f"{per_call_us(lambda: torch.add(a, a), 10_000)[1]:.2f} us per torch.add of 8 floats on the CPU"]
    if not dry and torch.cuda.is_available():
        g = torch.ones(8, device="cuda")
        parts.append(f"{per_call_us(lambda: torch.add(g, g), 10_000, torch.cuda.synchronize)[1]:.2f} us per "
                     "torch.add on the GPU (launch included)")
    return "; ".join(parts)


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=False).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown (no git)"
    return sha.strip() + (" (with uncommitted changes)" if dirty.strip() else "") if sha.strip() else "unknown"


#: The speed issue's GPU goals, all with CUDA graphs (``reduce-overhead``): steps/s all-in of two commands.
RATE_GOALS = {"main_command": ("the main command, all-in", 100.0), "icssl_cli": ("IC-SSL manifolds CLI, all-in", 200.0)}


def goal_rows(results: list[tuple[Step, dict[str, object]]]) -> list[tuple[str, str, str, bool]]:
    """``(goal, measured, target, met)`` for each goal the steps that ran measured, with CUDA graphs: the two
    all-in rates, and for each step-speed step Lightning / bare (deterministic kernels on) and what deterministic
    kernels cost Lightning's step."""
    rows = []
    for step, res in results:
        out = str(res["output"])
        if step.name in RATE_GOALS:
            found = re.search(r"^mode=reduce-overhead\s*:\s+([\d.]+) steps/s all-in", out, re.MULTILINE)
            if found:
                what, target = RATE_GOALS[step.name]
                rate = float(found.group(1))
                rows.append((what, f"{rate:.1f} steps/s", f">= {target:.0f} steps/s", rate >= target))
        elif step.script.endswith("step_speed.py"):
            ratio = re.search(r"^ratio lightning/bare mode=reduce-overhead deterministic=true: ([\d.]+)", out,
                              re.MULTILINE)
            if ratio:
                rows.append((f"{step.name}: Lightning / bare", ratio.group(1), ">= 0.95", float(ratio.group(1)) >= 0.95))
            cost = re.search(r"^deterministic cost lightning mode=reduce-overhead: ([+-][\d.]+) % time", out,
                             re.MULTILINE)
            if cost:
                rows.append((f"{step.name}: deterministic kernels", f"{cost.group(1)} % time", "<= +5 %",
                             float(cost.group(1)) <= 5.0))
    return rows


def report(results: list[tuple[Step, dict[str, object]]], dry: bool, started: dt.datetime, argv: str = "",
           host: str | None = None) -> str:
    """The suite's report; ``host``: :func:`host_line`'s measure of this machine's host (left out when ``None``)."""
    title = "GPU suite (CPU dry run: code paths only, the numbers mean nothing)" if dry else "GPU suite"
    lines = [
        f"# {title}", "",
        (f"Device: {device_line(dry)}. torch {torch.__version__}, Python {platform.python_version()}. "
         f"Date: {started:%Y-%m-%d %H:%M} UTC. Commit: {commit()}."),
        *([f"Host: {host}."] if host else []),
        f"Command: `python benchmarks/gpu_suite.py{' ' + argv if argv else ''}`.", "",
        "| step | measures | status | wall (s) | headline |", "|---|---|---|---|---|",
    ]
    for step, res in results:
        lines.append(f"| {step.name} | {step.measures} | {res['status']} | {res['seconds']:.0f} | "
                     f"{headline(step, str(res['output'])) or '-'} |")
    goals = goal_rows(results)
    lines += ["", "## Goals (CUDA graphs)", ""]
    if goals:
        lines += ["| goal | measured | target | met |", "|---|---|---|---|"]
        lines += [f"| {what} | {value} | {target} | {'yes' if met else 'no'} |" for what, value, target, met in goals]
    else:
        lines.append("None of the steps that ran measured a goal with CUDA graphs.")
    for step, res in results:
        lines += ["", f"## {step.name}", "", f"{step.measures}. Status: {res['status']}."]
        if res["cmd"]:
            output = str(res["output"]).rstrip().splitlines()
            kept = output if res["status"] == "ok" else output[-40:]
            lines += ["", "```", f"$ {res['cmd']}", *kept, "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny runs of every step on the CPU (seconds)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report file (default experiments/results/gpu_<date>.md)")
    parser.add_argument("--only", default=None,
                        help="comma-separated step names, run in the order given (default: all, in the order above)")
    parser.add_argument("--short", action="store_true",
                        help="the steps' short forms: fewer modes and steps, the same code paths; about 10 minutes for a chosen few")
    parser.add_argument("--budget", type=more_than(0, note=" seconds"), default=None, metavar="SECONDS",
                        help="wall time for the whole suite: each step gets at most what is left (less 30 s in "
                             "which a stopped step reports what it measured), and steps that find nothing left are "
                             "reported as not run")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; run on a machine with one, or pass --dry-run to check the code paths")
    names = {step.name for step in STEPS}
    chosen = args.only.split(",") if args.only else [step.name for step in STEPS]
    unknown = sorted(set(chosen) - names)
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(sorted(names))}")
    started = dt.datetime.now(dt.timezone.utc)
    out = args.out or ROOT / f"experiments/results/gpu_{started:%Y-%m-%d}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    by_name = {step.name: step for step in STEPS}
    results = []
    # Steps run in the order --only names them (most wanted first), and the report is rewritten after each
    # one: a lease that ends mid-suite still leaves every finished step's numbers on disk.
    shown_argv = " ".join(sys.argv[1:] if argv is None else argv)
    host = host_line(args.dry_run)
    print(f"[gpu_suite] host: {host}", flush=True)
    t0 = time.time()
    for name in chosen:
        step = by_name[name]
        # A step is asked to stop TERM_GRACE_S before the budget ends, so that it can still report.
        left = None if args.budget is None else args.budget - (time.time() - t0) - TERM_GRACE_S
        if left is not None and left < 5:
            results.append((step, {"status": "not run: --budget spent", "seconds": 0.0, "output": "", "cmd": ""}))
        else:
            print(f"[gpu_suite] {step.name} ...", flush=True)
            results.append((step, run_step(step, args.dry_run, args.short, left)))
        print(f"[gpu_suite] {step.name}: {results[-1][1]['status']} ({results[-1][1]['seconds']:.0f} s)", flush=True)
        out.write_text(report(results, args.dry_run, started, shown_argv, host))
    print(f"[gpu_suite] wrote {out}")
    return 0 if all(res["status"] == "ok" or str(res["status"]).startswith("skipped") for _, res in results) else 1


if __name__ == "__main__":
    sys.exit(main())

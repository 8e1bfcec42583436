"""What compiling I2CL's calibration forward costs and saves: compile time, ms per step, steps to break even.

    python benchmarks/i2cl_compile.py                                   # offline SmolLM2-135M, eager vs default
    python benchmarks/i2cl_compile.py --modes off,reduce-overhead --random-weights --model DIR   # on a GPU

For each mode (``off`` is eager; the others are ``--compile.mode`` values) it builds the LM afresh, compiles its
calibration forward as the CLI does (``I2CLModule.compile_targets``, dynamic prompt lengths), and runs ``--steps``
calibration steps of the module's own loss (``calibration_loss``: tokenisation, Eq. 4 injection, Eq. 6 noise,
backward, AdamW) on batches of 2 of the run's demonstrations, the query-alone prompts of ``i2cl`` and, with
``--prompts i2cl,icl_i2cl``, the demonstrations-first prompts of ``icl_i2cl`` in turn. Each step is timed to its
end (the device synchronised). It prints the steady ms per step (the mean of the steps after ``--warmup``), the
time the first steps took beyond that (compilation), the graphs compiled, and how many steps compilation needs to
pay for itself. A calibration of the offline config is 500 steps per method.

Compilation is cached on disk (inductor's and AOTAutograd's caches, under ``TORCHINDUCTOR_CACHE_DIR``): a second
run of the same LM compiles from the cache in seconds. Point that variable at an empty folder to measure a first
run.

``--random-weights`` builds the LM from ``config.json`` without its weights (a folder with the config and the
tokenizer files is enough): the timing does not depend on the values, and the weights are too large to carry to a
GPU machine. Runs on the GPU when one is visible, in the dtype the CLI picks (``auto``: bf16 on a GPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_options import at_least

from lit_icl.callbacks.compile import resolve_mode
from lit_icl.i2cl.calibration import calibration_loss
from lit_icl.i2cl.data import I2CLDataModule
from lit_icl.i2cl.module import I2CLModule
from lit_icl.i2cl.nets import CausalLM


def build_net(model: str, random_weights: bool, device: torch.device) -> CausalLM:
    """The offline LM (or a random one of its config), frozen, in the CLI's dtype for ``device``."""
    if not random_weights:
        return CausalLM(model).to(device)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    lm = lm.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    return CausalLM.from_objects(lm, AutoTokenizer.from_pretrained(model))


def prompts(args: argparse.Namespace) -> dict[str, list[str]]:
    """The calibration prompts of ``i2cl`` (query alone) and ``icl_i2cl`` (demonstrations first), as the module
    builds them from the offline movie-review task, or from the synthetic task when that is not there."""
    if Path(args.train_file).is_file() and Path(args.test_file).is_file():
        dm = I2CLDataModule(task="jsonl", train_file=args.train_file, test_file=args.test_file,
                            template="Review: {text}\nSentiment:", label_words=["negative", "positive"],
                            eval_samples=8, holdout_samples=0)
    else:
        dm = I2CLDataModule(task="synthetic", eval_samples=8, holdout_samples=0)
    data = dm.task_data()
    queries = [data.query(t) for t, _ in data.demos]
    return {"i2cl": queries, "icl_i2cl": [data.prefix + q for q in queries]}


def run(mode: str, args: argparse.Namespace, texts: dict[str, list[str]], device: torch.device) -> dict[str, float]:
    torch._dynamo.reset()
    net = build_net(args.model, args.random_weights, device)
    module = I2CLModule.__new__(I2CLModule)  # its compile settings and targets, without data or checkpoints
    torch.nn.Module.__init__(module)
    module.net = net
    resolved = resolve_mode(mode, device, module)
    if resolved != "off":
        for target in module.compile_targets():
            target.compile(backend=args.backend, mode=resolved if args.backend == "inductor" else None,
                           dynamic=module.compile_dynamic)
    L, D = net.n_layers, net.hidden_size
    g = torch.Generator().manual_seed(0)
    context = (0.1 * torch.randn(L, 2, D, generator=g)).to(device)
    coef = torch.nn.Parameter(torch.tensor([0.1, 1.0]).expand(L, 2, 2).clone().to(device))
    opt = torch.optim.AdamW([coef], lr=1e-2, weight_decay=1e-3)
    kinds = args.prompts.split(",")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.steps):
        batch_texts = texts[kinds[step % len(kinds)]]
        i = (2 * step) % (len(batch_texts) - 1)
        targets = torch.tensor([5, 7])
        sync()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = calibration_loss(net, context, coef, batch_texts[i : i + 2], targets, gamma=1e-3)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    steady = statistics.fmean(times[args.warmup:])  # a mean: prompts of two kinds alternate
    from torch._dynamo.utils import counters

    return {"steady_ms": 1000 * steady, "overhead_s": sum(times[: args.warmup]) - args.warmup * steady,
            "graphs": float(counters["stats"]["unique_graphs"]), "total_s": sum(times)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="data/i2cl/smollm2-135m-instruct")
    p.add_argument("--random-weights", action="store_true", help="build the LM from its config, without weights")
    p.add_argument("--train-file", default="data/i2cl/movie_reviews/train.jsonl")
    p.add_argument("--test-file", default="data/i2cl/movie_reviews/test.jsonl")
    p.add_argument("--modes", default="off,default", help="comma-separated: off and --compile.mode values")
    p.add_argument("--prompts", default="i2cl", help="i2cl, icl_i2cl or i2cl,icl_i2cl (alternating)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: a quick check)")
    p.add_argument("--steps", type=at_least(1), default=40)
    p.add_argument("--warmup", type=at_least(0), default=10, help="steps counted as compilation (a new length may "
                   "recompile once, into a graph with dynamic lengths)")
    p.add_argument("--threads", type=at_least(0), default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.warmup >= args.steps:
        p.error(f"--warmup must be smaller than --steps, got --warmup {args.warmup}, --steps {args.steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    texts = prompts(args)
    print(f"model {args.model}{' (random weights)' if args.random_weights else ''}  device {device}  torch "
          f"{torch.__version__}  threads {torch.get_num_threads()}  prompts {args.prompts}  steps {args.steps} "
          f"(the first {args.warmup} count as compilation)")
    results = {}
    for mode in args.modes.split(","):
        r = results[mode] = run(mode, args, texts, device)
        print(f"mode={mode:16s}: {r['steady_ms']:8.1f} ms/step steady, {r['overhead_s']:7.1f} s more in the first "
              f"{args.warmup} steps, {int(r['graphs'])} graphs, {r['total_s']:.1f} s for {args.steps} steps", flush=True)
    if "off" in results:
        eager = results["off"]["steady_ms"]
        for mode, r in results.items():
            if mode == "off":
                continue
            saved = eager - r["steady_ms"]
            even = f"{r['overhead_s'] * 1000 / saved:.0f} steps" if saved > 0 else "never (not faster)"
            print(f"mode={mode}: {eager / r['steady_ms']:.2f}x eager per step; compilation pays for itself after {even}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

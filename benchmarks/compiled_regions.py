"""Host time per training step with the net compiled in parts, whole, or whole with its loss (IC-SSL).

    python benchmarks/compiled_regions.py                  # IC-SSL's manifolds net, made tiny
    python benchmarks/compiled_regions.py --steps 3000 --rounds 3

A compiled net costs host time at each call besides its kernels: dynamo's guards, AOTAutograd's wrappers and,
under CUDA graphs, the replay's own bookkeeping, once for each compiled region in the forward and again in the
backward; every op left outside the compiled regions costs its own dispatch (and on a GPU its own launch).
IC-SSL's two-stage net is compiled as its representation and its head, which evaluation calls one by one. Its
training step can be compiled three ways, each a variant here:

- ``parts``: the representation and the head, two regions, the loss eager;
- ``net``: the whole net, one region, the loss eager (``ICSSLModule.compile_targets`` before the loss moved in);
- ``step``: the net and the loss as one module (``ICSSLModule.training_objective``, what the CLI compiles now).

This times the module's ``training_step`` and ``backward`` (the optimizer is the same either way and left out) on
the CPU with inductor's default mode, on a net and batch small enough that the host's part shows. Rounds
alternate between the variants, and the best of each is printed with the differences per step: on a shared
machine single rounds vary by more than the differences. Under CUDA graphs a replay also copies its inputs that
are not parameters into its own buffers; ``benchmarks/gpu_suite.py``'s ``step_speed_icssl`` measures the whole
step on a GPU.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings

import torch
from bench_options import at_least
from step_speed import ROOT, _stub_trainer, batches_ahead, build

from lit_icl.cli import process_defaults

#: A tiny IC-SSL net and batch (as the tests' runs), so the step's arithmetic does not hide its host time.
TINY = [
    "--model.init_args.net.init_args.representation.init_args.n_points=10",
    "--model.init_args.net.init_args.representation.init_args.stack_repeats=1",
    "--data.init_args.n_points=10", "--data.init_args.batch_size=1", "--data.init_args.chunk_size=1",
    "--data.init_args.train_label_ratio=[0.2, 0.5]", "--data.init_args.eval_label_ratios=[0.2, 0.5]",
    "--data.init_args.eval_batch_size=1", "--trainer.callbacks=[]",
]


def forward_backward_us(module: torch.nn.Module, batches: list, warmup: int) -> float:
    """Microseconds per ``training_step`` and ``backward`` (the compiled regions' calls; no optimizer)."""
    stub = _stub_trainer(len(batches))
    module._trainer = stub  # type: ignore[assignment]  # attribute reads only
    module.log = lambda *args, **kwargs: None  # type: ignore[method-assign]
    t0 = 0.0
    for i, batch in enumerate(batches):
        if i == warmup:
            t0 = time.perf_counter()
        module.training_step(batch, i).backward()
        for p in module.parameters():
            p.grad = None
    elapsed = time.perf_counter() - t0
    module._trainer = None
    return 1e6 * elapsed / (len(batches) - warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="a config file (default configs/icssl/manifolds.yaml)")
    parser.add_argument("--set", action="append", default=None, metavar="ARG",
                        help="an extra CLI argument; replaces the tiny-net defaults when given")
    parser.add_argument("--steps", type=at_least(1), default=2000, help="steps per timed run, warm-up included")
    parser.add_argument("--warmup", type=at_least(0), default=50)
    parser.add_argument("--rounds", type=at_least(1), default=2, help="rounds of (parts, net, step); the best of each counts")
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error(f"--warmup must be smaller than --steps, got --warmup {args.warmup}, --steps {args.steps}")
    configs = args.config or [str(ROOT / "configs/icssl/manifolds.yaml")]
    process_defaults()  # as python -m lit_icl does
    template, dm = build(configs, TINY if args.set is None else args.set)
    if not hasattr(template, "training_objective") or len(template.compile_targets()) < 3:
        parser.error(f"{type(template.net).__name__} has no parts to compile on their own: nothing to compare")
    device = torch.device("cpu")
    batches = batches_ahead(dm, args.steps, device)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for variant in ("parts", "net", "step"):
            torch._dynamo.reset()
            module = copy.deepcopy(template)
            targets = module.compile_targets()  # [training objective, net, representation, head]
            for target in {"parts": targets[2:], "net": targets[1:], "step": targets}[variant]:
                target.compile(mode="default")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                us = forward_backward_us(module.train(), batches, args.warmup)
            best[variant] = min(best.get(variant, us), us)
            print(f"{variant:5s}: {us:8.1f} us per step", flush=True)
    print(f"best: parts {best['parts']:.1f} us, net {best['net']:.1f} us, step {best['step']:.1f} us per step; "
          f"the net whole saves {best['parts'] - best['net']:.1f} us of each step, its loss inside "
          f"{best['net'] - best['step']:.1f} us more")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernels per training step once the nets are compiled, counted on the CPU: the GPU floor of a captured step.

    python benchmarks/compiled_kernels.py                              # every paper's main config
    python benchmarks/compiled_kernels.py --only icssl_manifolds --csv experiments/results/compiled_kernels_cpu.csv
    python benchmarks/compiled_kernels.py --only coqe_omniglot --eager     # and each op left outside the graphs

``launches_per_step.py`` counts the kernels of an eager step. Under ``--compile.mode`` the nets run as inductor
graphs instead, and under CUDA graphs a GPU replays each graph's kernels without the host, so what bounds such a
step's GPU time is how many kernels its graphs hold (each a few microseconds however little it computes). This
trains each study a few steps on the CPU with inductor's default mode (``CompileNets``, as the CLI compiles) and
reads one step from ``on_train_batch_start`` to ``on_train_batch_end`` with ``torch.profiler``, inductor's C++
kernels recorded (``torch._inductor.config.cpp.enable_kernel_profile``). Per step it prints:

- ``regions``: compiled graph calls, forward and backward (each is host time at every call, and a CUDA graph
  replay on a GPU);
- ``generated``: the kernels inductor wrote for those graphs (fused pointwise and reduction loops);
- ``extern``: the library calls inside them (matrix products, convolutions), the same on a GPU;
- ``eager``: the ops that ran outside any graph (loss parts, masks, logging), each a launch on a GPU.

``--eager`` lists those ops, each with the autograd node it ran in (``forward`` for the step's own).

The optimizer's update is left out (everything after ``on_before_optimizer_step``): on a GPU the project's
Adam/AdamW is ``fused``, a few kernels per step.
Inductor's CPU code fuses differently from its GPU (Triton) code, so ``generated`` is an estimate of the GPU's
count, not the count itself; ``extern`` and ``eager`` carry over. Compiling takes seconds to a minute per study
on two cores. Studies whose data or model are not installed are skipped, as in ``launches_per_step.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

import torch._inductor.config as inductor_config
from bench_options import at_least
from launches_per_step import (
    Study,
    fit_study,
    is_metadata_op,
    selected_studies,
    study_arguments,
    study_row,
    write_rows,
)
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.profiler import ProfilerActivity, profile, record_function

from lit_icl.callbacks.compile import CompileNets

#: How the profiler names a compiled graph's call, and an inductor-written C++ kernel inside it.
GRAPH_CALL, GENERATED = "## Call CompiledFxGraph", "graph_"
#: A marker recorded when the optimizer's update begins (Lightning runs forward and backward inside the
#: optimizer's ``step``, as its closure, so the update is told apart by time).
UPDATE = "## lit_icl: the update starts ##"


class StepProfile(Callback):
    """Profiles training step ``at`` (the compiled graphs are warm by then), batch start to batch end."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.prof: profile | None = None
        self.events: list[Any] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.at:
            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self.prof is not None:
            with record_function(UPDATE):
                pass

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.events = list(self.prof.events())
            self.prof = None


#: How the profiler names the autograd node a backward op runs in.
AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def tally(events: list[Any]) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """``(kinds, extern and eager ops by name, eager ops by name and where they ran)`` of a step's profiler events
    (see the module docstring); "where" is the autograd node of an op of the backward, else ``forward``."""
    kinds: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    eager: Counter[str] = Counter()
    update = min((e.time_range.start for e in events if e.name == UPDATE), default=float("inf"))

    def walk(event: Any, node: str) -> None:
        if event.time_range.start >= update:  # the optimizer's update: not counted
            return
        name = event.name
        if name.startswith(GRAPH_CALL):
            kinds["regions"] += 1
            for child in event.cpu_children:
                if child.name.startswith(GENERATED):
                    kinds["generated"] += 1
                elif child.name.startswith("aten::") and not is_metadata_op(child.name[6:]):
                    kinds["extern"] += 1
                    ops[child.name[6:]] += 1
        elif name.startswith("aten::"):  # called from Python, outside any graph; the ops inside it are its own
            if not is_metadata_op(name[6:]):
                kinds["eager"] += 1
                ops[name[6:]] += 1
                eager[f"{name[6:]} ({node})"] += 1
        else:
            if name.startswith(AUTOGRAD_NODE):
                node = name.removeprefix(AUTOGRAD_NODE)
            for child in event.cpu_children:
                walk(child, node)

    for event in events:
        if event.cpu_parent is None:
            walk(event, "forward")
    return kinds, ops, eager


def measure(study: Study, at: int, extra: list[str]) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Compile ``study``'s nets, train ``at + 1`` steps on the CPU and tally step ``at``."""
    step = StepProfile(at)
    fit_study(study, at + 1, [CompileNets(mode="default"), step], extra)
    return tally(step.events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    compiling = " (step 0 compiles the graphs, so its ops are compilation's)"
    parser.add_argument("--at", type=at_least(1, note=compiling), default=3,
                        help="the training step profiled (earlier ones compile)")
    parser.add_argument("--eager", action="store_true",
                        help="also list each op left outside the graphs, with the autograd node it ran in")
    study_arguments(parser)
    args = parser.parse_args(argv)
    studies = [s for s in selected_studies(parser, args) if not s.name.startswith("i2cl")]  # I2CL: i2cl_compile.py
    inductor_config.cpp.enable_kernel_profile = True  # each generated kernel is a profiler event
    print(f"{'study':28s} {'regions':>7s} {'generated':>9s} {'extern':>6s} {'eager':>5s} {'kernels':>7s} "
          f"{'floor, 2 us':>11s}  top extern and eager ops per step")
    rows = []
    for study in studies:
        kinds, ops, eager = measure(study, args.at, args.set)
        kernels = kinds["generated"] + kinds["extern"] + kinds["eager"]
        top = ", ".join(f"{name} {count}" for name, count in ops.most_common(6))
        print(f"{study.name:28s} {kinds['regions']:7d} {kinds['generated']:9d} {kinds['extern']:6d} "
              f"{kinds['eager']:5d} {kernels:7d} {kernels * 2e-3:9.2f} ms  {top}", flush=True)
        if args.eager:
            for where, count in sorted(eager.items()):
                print(f"    eager: {count:3d} x {where}", flush=True)
        rows.append(study_row(study, args.label, {
            "compiled_regions": str(kinds["regions"]), "generated_kernels": str(kinds["generated"]),
            "extern_calls": str(kinds["extern"]), "eager_ops": str(kinds["eager"]), "kernels": str(kernels),
        }))
    write_rows(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

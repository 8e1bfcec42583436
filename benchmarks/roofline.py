"""The least device time a training step can take on a given GPU, from the work it does, counted on the CPU.

    python benchmarks/roofline.py --config configs/coqe/omniglot.yaml                  # the main command's step
    python benchmarks/roofline.py --config configs/coqe/omniglot.yaml --precision bf16-mixed
    python benchmarks/roofline.py --config configs/icssl/manifolds.yaml

A step under CUDA graphs waits on nothing but its kernels, so its rate is bounded by the work it does. This
script counts that work without a GPU. It builds the module and data of a config as the CLI does, runs one
training step (forward, loss, backward) on the CPU, after one unmeasured step, under a ``TorchDispatchMode``
that sees every aten op once, as a GPU would launch it, and adds up per op

- the floating-point operations of convolutions and matrix products (``torch.utils.flop_counter``'s formulas);
- the bytes it reads and writes: its tensor inputs and outputs (ops that only make a view or allocate are left
  out, as in ``launches_per_step.py``);

and the parameter update of a fused Adam (one pass over parameters, gradients and the two moments).

From these it prints, for an H100 SXM and an H200 at their data-sheet peaks (dense tensor-core FLOP/s: TF32
495 T, bf16 989 T; memory 3.35 and 4.8 TB/s):

- **per-op roofline**: each op at ``max(flops / peak, bytes / bandwidth)``, summed: the eager step at the
  hardware's peak, every intermediate going through memory;
- **products only**: the convolutions and matrix products alone, as if every other op were fused into them for
  free: a floor that no compiler reaches;
- **kernel floor**: the kernels per step times ``--kernel-us`` (2 us: about the least time a kernel occupies an
  H100 even in a CUDA graph), the bound for steps made of many small kernels.

Real kernels reach a fraction of these peaks (small-channel convolutions and batch norms far less), so a
measured step is slower than every bound here. The bounds say which goal removing overhead can reach and which
needs less work per step. fp32 products count at the TF32 rate because the CLI sets
``torch.set_float32_matmul_precision("high")`` and cuDNN's convolutions use TF32 by default; ``--precision
bf16-mixed`` runs the step under CPU autocast to bf16, whose op list matches CUDA's for convolutions and
matrix products.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from bench_options import more_than
from launches_per_step import is_metadata_op
from step_speed import _stub_trainer, prepare
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

#: Data-sheet peaks, dense: tensor-core FLOP/s at TF32 and bf16, memory bytes/s.
GPUS = {
    "H100 SXM": {"tf32": 494.7e12, "bf16": 989.4e12, "bandwidth": 3.35e12},
    "H200": {"tf32": 494.7e12, "bf16": 989.4e12, "bandwidth": 4.8e12},
}
#: Op families counted as products (the work that runs on tensor cores).
PRODUCTS = {"convolution": "conv", "convolution_backward": "conv", "mm": "matmul", "addmm": "matmul",
            "bmm": "matmul", "baddbmm": "matmul", "_scaled_dot_product_flash_attention": "matmul",
            "_scaled_dot_product_efficient_attention": "matmul",
            "_scaled_dot_product_flash_attention_for_cpu": "matmul",
            "_scaled_dot_product_flash_attention_for_cpu_backward": "matmul"}


def _flops(name: str, packet: object, args: tuple, kwargs: dict, out: object) -> float:
    """FLOPs of one op: torch's formula, or for the CPU's fused attention (which torch's table lacks) the
    formula of the CUDA fused attention that a GPU runs in its place."""
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out))
    if name == "_scaled_dot_product_flash_attention_for_cpu":
        q, k, v = args[:3]
        return float(sdpa_flop_count(q.shape, k.shape, v.shape))
    if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
        grad_out, q, k, v = args[:4]
        return float(sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape))
    return 0.0


def _bytes(tree: object) -> int:
    leaves, _ = tree_flatten(tree)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


@dataclass
class OpRecord:
    """Every call of one op kind: ``(flops, bytes, low precision)`` each, and their totals."""

    calls: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    per_call: list[tuple[float, float, bool]] = field(default_factory=list)


class WorkCounter(TorchDispatchMode):
    """Records FLOPs and bytes of every op that reaches a kernel (views and allocations left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, OpRecord] = defaultdict(OpRecord)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        if is_metadata_op(name):
            return out
        flops = _flops(name, func._overloadpacket, args, kwargs, out)
        nbytes = float(_bytes((args, kwargs)) + _bytes(out))
        low = any(isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
                  for t in tree_flatten(args)[0])
        rec = self.ops[name]
        rec.calls += 1
        rec.flops += flops
        rec.bytes += nbytes
        rec.per_call.append((flops, nbytes, low))
        return out


def count_step(module: torch.nn.Module, batches: list, precision: str) -> tuple[WorkCounter, int]:
    """One unmeasured step, then one counted: the module's ``training_step`` and backward. Returns the counter
    and the parameters' element count (for the optimizer's pass)."""
    module.train()
    module._trainer = _stub_trainer(len(batches))  # attribute reads only, as step_speed.py's bare loop
    module.log = lambda *a, **k: None  # type: ignore[method-assign]  # logging is host work, not device work
    counter = WorkCounter()
    for i, batch in enumerate(batches[:2]):
        module.zero_grad(set_to_none=True)
        counting = counter if i == 1 else contextlib.nullcontext()
        with counting:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                loss = module.training_step(batch, i)
            loss.backward()
    n_params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    module._trainer = None
    return counter, n_params


def bounds(counter: WorkCounter, n_params: int, gpu: dict[str, float], kernel_us: float) -> dict[str, float]:
    """Milliseconds per step: per-op roofline, products only, kernel floor, and the optimizer's pass."""
    roofline = products = 0.0
    kernels = 0
    for name, rec in counter.ops.items():
        kernels += rec.calls
        for flops, nbytes, low in rec.per_call:
            peak = gpu["bf16"] if low else gpu["tf32"]
            t = max(flops / peak, nbytes / gpu["bandwidth"])
            roofline += t
            if name in PRODUCTS:
                products += t
    # Fused Adam: reads parameter, gradient and two moments, writes parameter and the moments (fp32 each).
    optimizer = 7 * 4 * n_params / gpu["bandwidth"]
    return {"roofline": 1e3 * (roofline + optimizer), "products": 1e3 * (products + optimizer),
            "kernels": kernels * kernel_us * 1e-3, "optimizer": 1e3 * optimizer, "n_kernels": kernels}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    kernel_us = more_than(0, note=" microseconds (the least GPU time of one kernel)")
    parser.add_argument("--kernel-us", type=kernel_us, default=2.0,
                        help="least GPU time of one kernel, microseconds")
    parser.add_argument("--top", type=int, default=8, help="op kinds listed by bytes moved")
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument for the config, e.g. --set=--data.init_args.batch_size=8")
    args = parser.parse_args(argv)
    args.device, args.steps, args.warmup = "cpu", 2, 1
    _, module, batches, _ = prepare(parser, args)
    counter, n_params = count_step(module, batches, args.precision)

    total_flops = sum(r.flops for r in counter.ops.values())
    total_bytes = sum(r.bytes for r in counter.ops.values())
    families: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, rec in counter.ops.items():
        fam = families[PRODUCTS.get(name, "other")]
        fam[0] += rec.calls
        fam[1] += rec.flops
        fam[2] += rec.bytes
    print(f"config: {' + '.join(args.config)}  precision: {args.precision}  torch {torch.__version__}")
    print(f"one training step (forward, loss, backward): {sum(r.calls for r in counter.ops.values())} kernels, "
          f"{total_flops / 1e9:.1f} GFLOP, {total_bytes / 1e9:.2f} GB read and written; "
          f"{n_params / 1e6:.2f} M parameters")
    for fam, (calls, flops, nbytes) in sorted(families.items()):
        print(f"  {fam:7s}: {calls:5.0f} kernels, {flops / 1e9:8.1f} GFLOP, {nbytes / 1e9:6.2f} GB")
    print(f"  op kinds moving the most bytes (of {len(counter.ops)}):")
    for name, rec in sorted(counter.ops.items(), key=lambda kv: -kv[1].bytes)[:args.top]:
        print(f"    {name:32s} {rec.calls:4d} x  {rec.bytes / 1e9:6.2f} GB  {rec.flops / 1e9:8.1f} GFLOP")
    for gpu_name, gpu in GPUS.items():
        b = bounds(counter, n_params, gpu, args.kernel_us)
        print(f"{gpu_name}: per-op roofline {b['roofline']:.2f} ms ({1e3 / b['roofline']:.0f} steps/s), "
              f"products only {b['products']:.2f} ms ({1e3 / b['products']:.0f} steps/s), "
              f"kernel floor {b['kernels']:.2f} ms ({b['n_kernels']} x {args.kernel_us:g} us); "
              f"fused Adam {b['optimizer']:.3f} ms of each")
    return 0


if __name__ == "__main__":
    sys.exit(main())

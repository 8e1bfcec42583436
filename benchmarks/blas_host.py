"""What one matrix product costs the host when it is launched from Python, not replayed in a CUDA graph.

    python benchmarks/blas_host.py                  # on a CUDA GPU: cuBLAS and cuBLASLt, deterministic on and off
    python benchmarks/blas_host.py --device cpu     # the same loop on the CPU (arithmetic included)

IC-SSL's training step makes about 240 small matrix products (the eigenmap's power steps, Eq. 15, and the RBF
Laplacian's blocks; ``experiments/results/compiled_kernels_cpu.md``). Replayed in a CUDA graph they cost the host
nothing; launched one by one, eagerly or by compiled code that runs outside a graph, each costs its host time. On
the H200 machine of 2026-11-26 an eager ``aten::bmm`` took 89 us of host time per call (self) against 9.3 us for a
plain kernel launch, so 145 uncaptured products in a backward would hold the host for about 13 ms. This says what
each product costs there, by BLAS library (``torch.backends.cuda.preferred_blas_library``) and with deterministic
kernels on and off, against a one-kernel elementwise op.

For each case the host issues ``--calls`` products without waiting (``host``: microseconds per call until the
last one is issued), then waits for the device (``all-in``: until the last one has run). ``host`` well above
the device's time per product means the host, not the GPU, sets the pace of a step made of such launches.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from bench_options import at_least

#: ``(name, operands)`` of IC-SSL-sized products (64 episodes of 100 points).
CASES: list[tuple[str, Callable[[torch.device], tuple[str, list[torch.Tensor]]]]] = [
    ("bmm 64x100x100 @ 64x100x4 (a power step)",
     lambda d: ("bmm", [torch.randn(64, 100, 100, device=d), torch.randn(64, 100, 4, device=d)])),
    ("bmm 64x100x100 @ 64x100x100 (a Laplacian product)",
     lambda d: ("bmm", [torch.randn(64, 100, 100, device=d), torch.randn(64, 100, 100, device=d)])),
    ("baddbmm 64x100x4 + 64x100x100 @ 64x100x4",
     lambda d: ("baddbmm", [torch.randn(64, 100, 4, device=d), torch.randn(64, 100, 100, device=d),
                            torch.randn(64, 100, 4, device=d)])),
    ("mm 6400x16 @ 16x16 (a token projection)",
     lambda d: ("mm", [torch.randn(6400, 16, device=d), torch.randn(16, 16, device=d)])),
    ("add 8 floats (one elementwise kernel, for reference)",
     lambda d: ("add", [torch.randn(8, device=d), torch.randn(8, device=d)])),
]


def per_call_us(fn: Callable[[], object], calls: int, sync: Callable[[], None] | None = None) -> tuple[float, float]:
    """``(host, all-in)`` microseconds per call of ``fn``: until the last of ``calls`` calls is issued, and until
    ``sync`` (the device's queue drained) returns after it; the best of 3 rounds, after a warm-up round."""
    best_host = best_all = float("inf")
    for _ in range(4):
        if sync is not None:
            sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        if sync is not None:
            sync()
        done = time.perf_counter()
        best_host = min(best_host, (issued - start) / calls * 1e6)
        best_all = min(best_all, (done - start) / calls * 1e6)
    return best_host, best_all


def settings(device: torch.device, libraries: list[str]) -> list[tuple[str, bool]]:
    """``(library, deterministic)`` pairs to time: each named BLAS library on a GPU (``default`` on a CPU), with
    deterministic kernels on and off."""
    libs = libraries if device.type == "cuda" else ["default"]
    return [(lib, det) for lib in libs for det in (False, True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=at_least(1), default=2000, help="products issued per timed round")
    parser.add_argument("--libraries", default="cublas,cublaslt",
                        help="BLAS libraries to time on a GPU (torch.backends.cuda.preferred_blas_library)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; pass --device cpu to run the same loop on the CPU")
    torch.manual_seed(0)
    cases = [(name, *make(device)) for name, make in CASES]
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    library = torch.backends.cuda.preferred_blas_library() if device.type == "cuda" else None
    print(f"device {device}, torch {torch.__version__}, {args.calls} calls per round", flush=True)
    try:
        for lib, deterministic in settings(device, args.libraries.split(",")):
            if device.type == "cuda":
                torch.backends.cuda.preferred_blas_library(lib)
            torch.use_deterministic_algorithms(deterministic)
            sync = torch.cuda.synchronize if device.type == "cuda" else None
            for name, op, operands in cases:
                fn = getattr(torch, op)
                host, all_in = per_call_us(lambda fn=fn, operands=operands: fn(*operands), args.calls, sync)
                print(f"blas={lib} deterministic={str(deterministic).lower()} {name}: host {host:.2f} us per "
                      f"call, all-in {all_in:.2f} us per call", flush=True)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        if library is not None:
            torch.backends.cuda.preferred_blas_library(library)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

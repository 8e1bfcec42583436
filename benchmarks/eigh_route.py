"""Milliseconds per batched ``eigh`` of graph Laplacians: on the device vs the host route of ``symmetric_eigenvectors``.

    python benchmarks/eigh_route.py --device cuda            # IC-SSL's batch sizes, 100-point episodes
    python benchmarks/eigh_route.py --device cpu --repeats 2 # the same code path on the CPU (both routes equal)

IC-SSL's EIG reference (App. D) and its EIG baselines solve one 100 x 100 Laplacian per episode, 64 episodes
a batch. On a CUDA device torch solves such a batch one matrix at a time;
:func:`lit_icl.core.spectral.symmetric_eigenvectors` sends it to the host's LAPACK instead. This prints both
times per batch shape, and the time of the whole :func:`~lit_icl.core.spectral.laplacian_eigenmap` (graph,
Laplacian and eigenvectors) with the route it now takes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from bench_options import at_least

from lit_icl.core.spectral import (
    eigh_on_host,
    graph_laplacian,
    knn_rbf_adjacency,
    laplacian_eigenmap,
    symmetric_eigenvectors,
)


def _ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up, in ms, waiting for the device each time."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default="64,128", help="episodes per batch, comma-separated")
    parser.add_argument("--points", type=at_least(1), default=100, help="points per episode (the matrix size)")
    parser.add_argument("--repeats", type=at_least(1), default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; host threads {torch.get_num_threads()}")
    for b in (int(s) for s in args.batches.split(",")):
        x = torch.rand(b, args.points, 2, generator=torch.Generator().manual_seed(b)).to(device)
        lap = graph_laplacian(knn_rbf_adjacency(x))
        on_device = _ms(lambda lap=lap: torch.linalg.eigh(lap), device, args.repeats)
        routed = _ms(lambda lap=lap: symmetric_eigenvectors(lap), device, args.repeats)
        whole = _ms(lambda x=x: laplacian_eigenmap(x), device, args.repeats)
        route = "host" if eigh_on_host(lap.shape, device) else "device"
        print(f"eigh {tuple(lap.shape)} float32: on the device {on_device:.1f} ms, symmetric_eigenvectors "
              f"({route} route) {routed:.1f} ms ({on_device / routed:.1f}x); laplacian_eigenmap {whole:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does a copy to the GPU make the host wait for the work queued before it? Pageable vs pinned host memory.

    python benchmarks/h2d_copy.py                 # on a CUDA GPU: the sizes of this project's per-step copies
    python benchmarks/h2d_copy.py --device cpu    # the same loop on the CPU (nothing is queued; no pinning)

For each size, the GPU is first given ``--queued-ms`` of work (``torch.cuda._sleep``), then the host times the call
``x.to("cuda", non_blocking=True)``: from ordinary (pageable) memory, from pinned memory, and (for comparison) the
blocking copy. A call that returns in microseconds only queued its copy; one that takes about the queued time
waited for the GPU, which in a training step puts the host's own time on top of the GPU's instead of beside it.
CUDA documents pageable copies as "might be synchronous with respect to host"; this says where they are, on the
driver at hand, and what :func:`lit_icl.core.transfer.to_device` pays to pin (``x.pin_memory()``).

Default sizes: CoQE's batch of sequence indices (6.8 KiB), IC-SSL's training batch (126 KiB), CoQE's logit noise
(24 x 1,613 float32, 151 KiB), IC-SSL's validation batch (250 KiB), the mmca synthetic validation batch (3.2 MiB)
and its full training batch (25.7 MiB, now kept on the GPU).
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_options import at_least

#: Bytes of the copies a training or validation step of this project makes (see the docstring).
DEFAULT_SIZES = "6912,128512,154848,256000,3366000,26928000"


def _cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, measured with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize(device)
    return cycles / start.elapsed_time(end)


def _host_ms(fn, queue) -> float:
    """Host milliseconds of ``fn()`` called right after ``queue()`` has given the device its work."""
    queue()
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def _label(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes per copy, comma-separated")
    parser.add_argument("--queued-ms", type=at_least(0, float), default=20.0, help="GPU work queued before each copy")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="the median of this many copies is printed")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        cycles = int(args.queued_ms * _cycles_per_ms(device))

        def queue() -> None:
            torch.cuda.synchronize(device)
            torch.cuda._sleep(cycles)
    else:
        def queue() -> None:  # nothing runs asynchronously on the CPU
            pass

    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"device: {name}; torch {torch.__version__}; {args.queued_ms:g} ms of GPU work queued before each copy"
          if cuda else f"device: {name}; torch {torch.__version__}; no queue to wait for")
    for size in (int(s) for s in args.sizes.split(",")):
        x = torch.empty(size // 4, dtype=torch.float32).uniform_()
        times: dict[str, list[float]] = {"pageable": [], "pinned": [], "blocking": [], "pin": []}
        pinned = x.pin_memory() if cuda else None
        for _ in range(args.repeats + 1):  # the first round warms up the allocators
            times["pageable"].append(_host_ms(lambda x=x: x.to(device, non_blocking=True, copy=True), queue))
            times["blocking"].append(_host_ms(lambda x=x: x.to(device, copy=True), queue))
            if cuda:
                times["pinned"].append(_host_ms(lambda p=pinned: p.to(device, non_blocking=True), queue))
                times["pin"].append(_host_ms(lambda x=x: x.pin_memory(), lambda: None))
        if cuda:
            torch.cuda.synchronize(device)
        med = {k: sorted(v[1:])[len(v[1:]) // 2] for k, v in times.items() if v}
        waited = "yes" if med["pageable"] > args.queued_ms / 2 else "no"
        pinned_text = f"pinned non-blocking {med['pinned']:.3f} ms, " if cuda else ""
        pin_text = f", pin_memory() {med['pin']:.3f} ms" if cuda else ""
        print(f"copy {_label(size)}: pageable non-blocking {med['pageable']:.3f} ms, {pinned_text}"
              f"blocking {med['blocking']:.3f} ms{pin_text}; pageable waited for the queue: "
              f"{waited if cuda else 'n/a'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

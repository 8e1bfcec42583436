"""What DDP ranks pay per training step to agree to stop: Lightning 2.6's SIGTERM broadcast against the CLI's vote.

    python benchmarks/ddp_stop_vote.py                        # 2 gloo ranks on one CUDA GPU (when there is one)
    python benchmarks/ddp_stop_vote.py --device cpu           # 2 gloo ranks on the CPU

Two processes (a gloo group, as CPU DDP runs; on a GPU both share it) run ``--steps`` simulated training steps: each
queues ``--gpu-ms`` of GPU work (``torch.cuda._sleep``; none on the CPU), spends ``--host-ms`` of host time (what
Lightning and the step's launches cost the host), then runs the step boundary of one variant:

- ``lightning``: Lightning's own ``_TrainingEpochLoop._broadcast_sigterm_tensor``, called as its training loop calls
  it before every batch under DDP (a tensor made on the training device, broadcast from rank 0, read back);
- ``vote``: :class:`lit_icl.callbacks.ddp_stop.StopVote` (host flags all-reduced over a gloo group, read one step
  later), what :class:`~lit_icl.callbacks.StopTogether` runs in its place (and in place of the ``Timer``'s
  per-batch broadcast under ``max_time``, which this does not time);
- ``none``: no agreement (the floor).

Printed per variant: steps/s (from the first timed step to the device's end of the last) and the host time of the
boundary alone (median over steps). A boundary that waits for the GPU costs about ``--gpu-ms`` and puts the host's
time on top of the GPU's; one that does not leaves the step at the larger of the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bench_options import at_least
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

from lit_icl.callbacks.ddp_stop import StopVote

VARIANTS = ("none", "lightning", "vote")


def _busy(ms: float) -> None:
    """Spend ``ms`` of host time (a busy loop: sleeping would hand the core to the other rank)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def _cycles_per_ms(device: torch.device) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm-up
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize(device)
    return 10_000_000 / start.elapsed_time(end)


def _run(rank: int, args: argparse.Namespace, port: int, results: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    cycles = int(args.gpu_ms * _cycles_per_ms(device)) if cuda else 0
    # What Lightning's method reads from its loop: the trainer's flag and training device.
    loop = SimpleNamespace(trainer=SimpleNamespace(received_sigterm=False, strategy=SimpleNamespace(root_device=device)))
    for variant in VARIANTS:
        vote = StopVote(dist.new_group(backend="gloo")) if variant == "vote" else None
        boundary = {
            "none": lambda: None,
            "lightning": lambda: _TrainingEpochLoop._broadcast_sigterm_tensor(loop),
            "vote": lambda vote=vote: vote.poll(False, False),
        }[variant]
        spent: list[float] = []
        dist.barrier()
        t0 = 0.0
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                if cuda:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
            if cuda:
                torch.cuda._sleep(cycles)
            _busy(args.host_ms)
            b0 = time.perf_counter()
            boundary()
            spent.append(time.perf_counter() - b0)
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
        if vote is not None:
            vote.close()
        results.put((rank, variant, args.steps / elapsed, 1e6 * statistics.median(spent[args.warmup:])))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=at_least(1), default=300)
    parser.add_argument("--warmup", type=at_least(0), default=20)
    parser.add_argument("--host-ms", type=at_least(0, float), default=3.0, help="host time per step")
    parser.add_argument("--gpu-ms", type=at_least(0, float), default=4.0, help="GPU work queued per step and rank (CUDA only)")
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    where = f"{torch.cuda.get_device_name(0)}, both ranks on it" if cuda else "cpu"
    gpu = f"{args.gpu_ms:g} ms of GPU work per step and rank, " if cuda else ""
    print(f"2 gloo ranks on {where}; torch {torch.__version__}; {gpu}{args.host_ms:g} ms of host time per step; "
          f"{args.steps} steps after {args.warmup}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(r, args, args.port, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=600) for _ in range(2 * len(VARIANTS))]
    for p in procs:
        p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        print("a rank failed")
        return 1
    for variant in VARIANTS:
        rate = min(r[2] for r in rows if r[1] == variant)  # the slower rank sets the pace
        spent = max(r[3] for r in rows if r[1] == variant)
        print(f"boundary {variant}: {rate:.1f} steps/s, boundary host time {spent:.0f} us (median, slower rank)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

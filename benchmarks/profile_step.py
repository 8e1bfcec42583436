"""What a training step's device time is made of: kernels per step and the kernels that take the time.

    python benchmarks/profile_step.py --config configs/coqe/omniglot.yaml --device cuda --modes reduce-overhead,off
    python benchmarks/profile_step.py --config configs/icssl/manifolds.yaml --device cpu --modes off --steps 6

The main command's step is GPU-bound under CUDA graphs (11.2 ms in a bare loop on an H200, 2026-11-27), so the
way past 100 steps/s is less device work per step, and this says which work. For each compile mode it runs
``step_speed.py``'s bare loop (the module's own ``training_step``, backward and optimizer, batches made ahead)
under ``torch.profiler`` for the timed steps, and prints

- host time per step (wall clock), device time per step (the sum of the device's kernel times) and kernels per
  step;
- the ``--top`` kernels (or, on a CPU, aten ops) by device time, with calls and microseconds per step;
- where the host's time goes: the ``--top`` host-side events by their own CPU time (aten ops, CUDA runtime calls
  such as ``cudaGraphLaunch``, and ranges such as ``CompiledFunction`` or the optimizer's step, whose own time is
  the Python around their children), and the calls per step that make the host wait for the device
  (``cudaStreamSynchronize`` and the like). A step whose host time exceeds its device time is host-bound: its
  rate is set there, not by its kernels.

On a CPU there are no kernels: the table lists the ops by their own CPU time instead, which checks the script.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import defaultdict
from typing import Any

import torch
from bench_options import at_least
from step_speed import bare_steps, describe, prepare
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def _by_name(events: Any, time_of: Any) -> dict[str, list[float]]:
    """``{name: [calls, microseconds]}`` over the events for which ``time_of(evt)`` gives a time (not None)."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for evt in events:
        us = time_of(evt)
        if us is not None:
            entry = by_name[evt.name]
            entry[0] += 1
            entry[1] += us
    return by_name


def _top(by_name: dict[str, list[float]], steps: int, top: int) -> list[str]:
    """The ``top`` names by time: microseconds and share of the total, and calls, per step."""
    total_us = sum(us for _, us in by_name.values())
    lines = []
    for name, (n, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        share = 100 * us / total_us if total_us else 0.0
        lines.append(f"    {us / steps:9.1f} us {share:5.1f} %  {n / steps:6.1f} x  {name[:110]}")
    return lines


def summarize(prof: Any, steps: int, device: torch.device, top: int) -> list[str]:
    """Lines: totals per step, then the ``top`` kernels (ops on a CPU) by time per step."""
    on_device = device.type == "cuda"

    def time_of(evt: Any) -> float | None:
        if on_device:
            return evt.time_range.elapsed_us() if evt.device_type == DeviceType.CUDA else None
        return evt.self_cpu_time_total if evt.name.startswith("aten::") else None

    by_name = _by_name(prof.events(), time_of)
    total_us = sum(us for _, us in by_name.values())
    calls = sum(n for n, _ in by_name.values())
    what = "kernels" if on_device else "aten ops (own CPU time)"
    return [f"  {what}: {calls / steps:.0f} per step, {total_us / steps / 1000:.3f} ms per step",
            *_top(by_name, steps, top)]


#: CUDA runtime calls that block the host until the device has caught up.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def host_lines(prof: Any, steps: int, top: int) -> list[str]:
    """Lines: the host's own time per step, its waits on the device, and the ``top`` host-side events."""
    by_name = _by_name(prof.events(), lambda evt: evt.self_cpu_time_total if evt.device_type == DeviceType.CPU
                       and not evt.name.startswith("ProfilerStep") else None)
    total_us = sum(us for _, us in by_name.values())
    syncs = sum(n for name, (n, _) in by_name.items() if name in SYNC_CALLS)
    head = (f"  host: {total_us / steps / 1000:.3f} ms of own CPU time per step in {len(by_name)} kinds of event; "
            f"{syncs / steps:.2f} waits on the device per step")
    return [head, *_top(by_name, steps, top)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="a config file; repeat for overlays")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", default="reduce-overhead,off", help="comma-separated: off and --compile.mode values")
    parser.add_argument("--deterministic", default="true", choices=["true", "false"])
    parser.add_argument("--steps", type=at_least(1), default=60, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=at_least(0), default=40,
                        help="steps before profiling (compilation happens there)")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], metavar="ARG",
                        help="an extra CLI argument, e.g. --set=--trainer.precision=bf16-mixed")
    args = parser.parse_args(argv)
    device, template, batches, state = prepare(parser, args)
    timed = args.steps - args.warmup
    print(f"config: {' + '.join(args.config)}  device: {describe(device)}  torch {torch.__version__}"
          f"  steps profiled: {timed} (after {args.warmup})", flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for mode in args.modes.split(","):
        module = copy.deepcopy(template)
        module.load_state_dict(state)
        torch._dynamo.reset()
        prof = profile(activities=activities)
        try:
            rate = bare_steps(module, batches, mode, args.warmup, device, args.deterministic == "true",
                              profiler=prof)
        except Exception as err:  # noqa: BLE001  # one failing mode must not hide the others
            print(f"mode={mode}: FAILED {type(err).__name__}: {str(err).splitlines()[0][:300]}", flush=True)
            continue
        # The profiler's own bookkeeping slows the host, so this rate is below step_speed.py's.
        print(f"mode={mode}: {1000 / rate:.3f} ms of wall time per step under the profiler", flush=True)
        print("\n".join(summarize(prof, timed, device, args.top)), flush=True)
        print("\n".join(host_lines(prof, timed, args.top)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a run's host time goes: ``StepTrace`` (a window of steps under ``torch.profiler``) and ``PhaseProfiler``.

    python benchmarks/main_command.py --config configs/icssl/manifolds.yaml --modes reduce-overhead \\
        --seconds 60 --trace 300:20 --trace-dir OUT

``main_command.py --trace START:STEPS`` adds this callback to the run (``--trainer.callbacks+=step_trace.StepTrace``,
with ``benchmarks/`` on the run's ``PYTHONPATH``). It records steps ``START`` to ``START + STEPS - 1`` with
``torch.profiler`` (host and, on a GPU, device activity), after compilation, CUDA-graph recording and the first
validation round when ``START`` is chosen past them, and marks the stages of each step as ranges:

- ``step``: from ``on_train_batch_start`` to ``on_train_batch_end``;
- ``backward``: from ``on_before_backward`` to ``on_after_backward`` (the loss's backward, as Lightning runs it);
- ``update``: from ``on_before_optimizer_step`` to the end of the step (the optimizer, the LR schedule, logging);
- and what lies between one step's end and the next one's start (fetching the next batch, Lightning's loop).

With ``val_round`` (``main_command.py --trace-val ROUND``) it also profiles one validation round, its batches
marked as ``val_batch`` (from ``on_validation_batch_start`` to the end of the callbacks' ``on_validation_batch_end``,
where metrics such as IC-SSL's representation scores run) and the whole round as ``round``.

What a step waits on shows in the CUDA runtime calls made inside each range, counted per step: a captured step
replays its graphs with one ``cudaGraphLaunch`` each, a graph run without capture launches its kernels one by one
(``cudaLaunchKernel``, ``cuLaunchKernel``), and the host waits for the device in the synchronising calls
(``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``, a ``cudaMemcpy`` that is not
``Async``). The host time of all CUDA calls is given too, and the other calls by their time: a copy from
pageable memory or a pinned allocation (``cudaHostAlloc``) can hold the host as well. The host time between one
step and the next (making and pinning the next batch, Lightning's loop) gets the same census. On a GPU the
allocators' own counters over the window say how often memory came from CUDA rather than from their caches:
device allocations and frees (``cudaMalloc``, and ``cudaFree``, which waits for the device), the allocator's
retries (a retry frees every cached block and waits), and pinned host allocations (``cudaHostAlloc``) with their
time. Printed as lines starting ``lit_icl trace:`` (``main_command.py`` repeats them), with the ops that took the
most host time, and written with the full table to ``path`` (and a Chrome trace beside it).

With ``python=True`` (``main_command.py --trace-python START:STEPS``, a window of its own) the profiler also
records every Python call (``with_stack``), on every thread, and the report gives, per range, the Python functions
and ops with the most *self* host time: where a step's host time goes when it is not in CUDA calls, such as CUDA
graph trees' bookkeeping around a replay, which on a GPU runs on autograd's thread during the backward. Tracing
Python slows the host several-fold, so that window's times are for attribution, not rates; its lines begin
``python-traced``.

``PhaseProfiler`` is Lightning's ``SimpleProfiler`` with each stage's *median* next to its mean
(``main_command.py --phases``). A stage's first call pays for compiling its graphs and recording its CUDA graphs
(tens of seconds), which its mean spreads over every call: a 55 s IC-SSL run's 7 s of backward compilation adds
5 ms to its mean backward over 1,369 steps. The median is what a step costs once that is done. It also records
each of Python's cyclic garbage collections, as the stages ``gc (generation N)``: a collection of the oldest
generation walks every object the process holds (hundreds of thousands once a net is compiled), and its time also
lands in the mean of whichever stage it interrupted.
"""

from __future__ import annotations

import gc
import itertools
import math
import re
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.profilers import SimpleProfiler
from torch.profiler import ProfilerActivity, profile, record_function

#: The ranges this callback marks, by name in the trace: those of a training step, those of a validation round.
RANGES = ("step", "backward", "update")
VAL_RANGES = ("val_batch", "round")
#: What each range is counted per in the report.
UNIT = {"step": "step", "backward": "step", "update": "step", "val_batch": "batch", "round": "round"}
#: CUDA runtime and driver calls by what they mean for a step.
GRAPH_LAUNCHES = ("cudaGraphLaunch",)
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")
PREFIX = "lit_icl trace:"
#: What begins each line of a window traced with ``python=True``.
PYTHON_LABEL = "python-traced"
#: The name under which the time between one span of a window's first range and the next is counted.
BETWEEN = "between"


def _range(name: str) -> str:
    return f"## lit_icl {name} ##"


def _plural(unit: str, n: int) -> str:
    return unit if n == 1 else f"{unit}es" if unit.endswith("ch") else f"{unit}s"


class StepTrace(Callback):
    """Profile training steps ``start`` to ``start + steps - 1`` (global steps), and validation round
    ``val_round``, and report each (module docstring).

    Args:
        start: the first global step profiled; choose it past compilation and the first validation round.
            ``None``: no training steps.
        steps: how many steps to profile.
        val_round: the validation round to profile (1 is the first after the sanity check; choose one after the
            first, whose graphs are compiled and recorded by then), or the first one after it that the training
            window leaves free. ``None``: none.
        path: the report's file (the Chrome trace is written beside it, ``.json``; a validation round's as
            ``<name>-val``); ``None``: printed only.
        top: how many ops by host time the printed report lists.
        python: record every Python call too, and list each range's Python functions and ops by self host time
            (several-fold slower on the host: a window for attribution, apart from one for rates).
    """

    def __init__(self, start: int | None = 100, steps: int = 20, val_round: int | None = None,
                 path: str | None = None, top: int = 12, python: bool = False) -> None:
        if (start is not None and start < 0) or steps < 1 or (val_round is not None and val_round < 1):
            raise ValueError(f"start={start} must be None or >= 0, steps={steps} >= 1, val_round={val_round} None "
                             "or >= 1")
        if start is None and val_round is None:
            raise ValueError("nothing to profile: give start (training steps) or val_round (a validation round)")
        self.start, self.steps, self.val_round, self.path, self.top = start, steps, val_round, path, top
        self.python = python
        self._prof: profile | None = None
        self._kind: str | None = None  # "train" or "val" while profiling
        self._open: dict[str, record_function] = {}
        self._train_done, self._val_done = start is None, val_round is None
        self._rounds = 0  # validation rounds begun (the sanity check apart)
        self._counters: dict[str, float] = {}  # the allocators' counters when the window began

    # ------------------------------------------------------------------ ranges
    def _enter(self, name: str) -> None:
        if self._prof is not None and name not in self._open:
            self._open[name] = record_function(_range(name))
            self._open[name].__enter__()

    def _exit(self, name: str) -> None:
        rf = self._open.pop(name, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def _begin(self, kind: str, pl_module: LightningModule) -> bool:
        """Start profiling; ``False`` (and the window given up, with a line saying so) when another profiler is
        recording, such as a second ``StepTrace`` whose window this one overlaps."""
        if torch.autograd._profiler_enabled():
            label = f"{PYTHON_LABEL} " if self.python else ""
            what = "training window" if kind == "train" else "validation round"
            print(f"{PREFIX} {label}{what} not profiled: another profiler was recording", flush=True)
            return False
        activities = [ProfilerActivity.CPU]
        if pl_module.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize(pl_module.device)  # the window starts with an idle device
        self._prof, self._kind = profile(activities=activities, with_stack=self.python), kind
        self._counters = allocator_counters(pl_module.device)
        self._prof.start()
        return True

    # ------------------------------------------------------------------ training steps
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._kind is None and not self._train_done and trainer.global_step >= self.start:
            if not trainer.is_global_zero:  # under DDP the first process profiles (its steps are every process's)
                self._train_done = True
                return
            if not self._begin("train", pl_module):
                self._train_done = True
        if self._kind == "train":
            self._enter("step")

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if self._kind == "train":
            self._enter("backward")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._exit("backward")

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self._kind == "train":
            self._enter("update")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._kind != "train":
            return
        self._exit("update")
        self._exit("step")
        if trainer.global_step >= self.start + self.steps:
            self._finish(pl_module)

    # ------------------------------------------------------------------ a validation round
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._rounds += 1
        if self._kind is None and not self._val_done and self._rounds >= self.val_round:
            if not trainer.is_global_zero:
                self._val_done = True
                return
            if not self._begin("val", pl_module):
                self._val_done = True
                return
            self._enter("round")

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        if self._kind == "val":
            self._enter("val_batch")

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._kind == "val":
            self._exit("val_batch")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._kind == "val":
            self._exit("round")
            self._finish(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._prof is not None:  # the run ended inside the window: report what was recorded
            for name in list(self._open):
                self._exit(name)
            self._finish(pl_module)

    # ------------------------------------------------------------------ the report
    def _finish(self, pl_module: LightningModule) -> None:
        prof, kind, self._prof, self._kind = self._prof, self._kind, None, None
        if kind == "train":
            self._train_done = True
        else:
            self._val_done = True
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        prof.stop()
        lines = summarize(prof, self.top, RANGES if kind == "train" else VAL_RANGES, python=self.python)
        if self._counters:
            first = RANGES[0] if kind == "train" else VAL_RANGES[0]
            units = sum(1 for e in prof.events() if e.name == _range(first))
            lines.insert(-1, allocator_line(self._counters, allocator_counters(pl_module.device), units, UNIT[first]))
        if kind == "val":
            lines = [f"validation round {self._rounds}: {line}" for line in lines]
        if self.python:
            lines = [f"{PYTHON_LABEL} {line}" for line in lines]
        for line in lines:
            print(f"{PREFIX} {line}", flush=True)
        if self.path is not None:
            path = Path(self.path)
            if kind == "val":
                path = path.with_name(f"{path.stem}-val{path.suffix}")
            path.parent.mkdir(parents=True, exist_ok=True)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
            path.write_text("\n".join(lines) + "\n\n" + table + "\n")
            prof.export_chrome_trace(str(path.with_suffix(".json")))


#: The allocators' counters a window reports, by the name it prints: CUDA's caching allocator (``memory_stats``)
#: and the pinned host allocator (``host_memory_stats``; its time in microseconds).
DEVICE_COUNTERS = {"cudaMalloc": "num_device_alloc", "cudaFree": "num_device_free",
                   "allocator retries": "num_alloc_retries"}
HOST_COUNTERS = {"pinned host allocations": "num_host_alloc", "pinned allocation us": "host_alloc_time.total"}


def allocator_counters(device: torch.device) -> dict[str, float]:
    """The allocators' counters now (host reads only, no wait for the device); ``{}`` off CUDA. A counter that
    this torch does not keep is left out."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    try:  # newer than the device allocator's counters; a torch without it keeps no pinned counters
        host_stats = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        host_stats = {}
    counters = {name: float(stats[key]) for name, key in DEVICE_COUNTERS.items() if key in stats}
    counters.update({name: float(host_stats[key]) for name, key in HOST_COUNTERS.items() if key in host_stats})
    return counters


def allocator_line(before: dict[str, float], after: dict[str, float], units: int, unit: str) -> str:
    """What the allocators did over a window of ``units`` steps (or batches), per ``unit``."""
    n = max(units, 1)
    parts = [f"{(after[name] - before[name]) / n:.2f} {name}" for name in (*DEVICE_COUNTERS, "pinned host allocations")
             if name in before and name in after]
    if "pinned allocation us" in before and "pinned allocation us" in after:
        parts.append(f"{(after['pinned allocation us'] - before['pinned allocation us']) / 1e3 / n:.2f} ms in them")
    return f"allocators per {unit}: " + (", ".join(parts) if parts else "no counters in this torch")


def _census(label: str, per: str, each: int, host_ms: float, calls: Counter[str], call_us: Counter[str],
            sync_us: float) -> list[str]:
    """The lines of one range (or of the time between ranges): its host time and CUDA calls, per ``per``."""
    graphs = sum(calls[k] for k in GRAPH_LAUNCHES)
    kernels = sum(calls[k] for k in KERNEL_LAUNCHES)
    syncs = sum(calls[k] for k in SYNCS)
    first = (f"{label}: {host_ms:.2f} ms of host time per {per}; per {per} {graphs / each:.1f} CUDA graph launches, "
             f"{kernels / each:.1f} kernel launches, {syncs / each:.1f} synchronising calls "
             f"({sync_us / 1e3 / each:.2f} ms waiting), {sum(call_us.values()) / 1e3 / each:.2f} ms in all CUDA calls")
    lines = [first]
    # The rest (copies, events, allocations), by host time: a copy or an allocation may block too.
    others = {k: v for k, v in calls.items() if k not in (*GRAPH_LAUNCHES, *KERNEL_LAUNCHES, *SYNCS)}
    if others:
        shown = ", ".join(f"{k} {v / each:.1f}x ({call_us[k] / 1e3 / each:.2f} ms)"
                          for k, v in sorted(others.items(), key=lambda kv: -call_us[kv[0]])[:6])
        lines.append(f"{label}: other CUDA calls per {per}: {shown}")
    return lines


#: What a traced name carries that differs between machines and runs: the folders above a package, an address.
_PATH_PREFIX = re.compile(r"^/\S*/(?:site-packages|dist-packages|lib/python3\.\d+)/")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
#: Any other absolute path of a Python file (inductor's generated code, in a cache folder): its file name is kept.
_OTHER_PATH = re.compile(r"^/\S*/(?=[^/\s]+\.py\(\d+\))")
_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def traced_name(name: str) -> str:
    """A profiler event's name without what names the machine: a Python function as ``package/file.py(line): f``
    (or the file in this repository), a built-in method without its object's address."""
    return _ADDRESS.sub("", _OTHER_PATH.sub("", _PATH_PREFIX.sub("", name.replace(_ROOT, "", 1))))


def self_time_lines(events: list[Any], windows: dict[str, list[tuple[float, float]]], counts: dict[str, int],
                    units: dict[str, str], top: int) -> list[str]:
    """Per range: the Python functions and ops with the most self host time in it, per step (or batch), on the
    threads that do the step's work. ``windows``: each range's spans; ``counts``: how many steps each is averaged
    over.

    The threads counted are the one that marks the ranges and every thread that runs ops or CUDA calls in the
    window (autograd's device thread, which runs a GPU backward, or a loader's pinning thread); a thread that only
    waits meanwhile (TensorBoard's writer on its queue) would show its idle wait as self time and is left out."""
    busy = {e.thread for e in events if e.name.startswith(("## lit_icl", "aten::", "cuda", "cu"))}
    events = [e for e in events if e.thread in busy]
    lines = []
    for name, spans in windows.items():
        if not spans:
            continue
        self_us: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        for e in events:
            if e.name.startswith("## lit_icl"):
                continue
            t = e.time_range.start
            if any(lo <= t <= hi for lo, hi in spans):
                key = traced_name(e.name)
                self_us[key] += e.self_cpu_time_total
                calls[key] += 1
        n = max(counts[name], 1)
        shown = ", ".join(f"{key} {us / 1e3 / n:.2f} ms ({calls[key] / n:.1f}x)" for key, us in self_us.most_common(top))
        label = name if name != BETWEEN else f"between {_plural(units[name], 2)}"
        lines.append(f"{label}: most host time per {units[name]} (self, Python functions and ops): {shown or 'none'}")
    return lines


def summarize(prof: profile, top: int, names: tuple[str, ...] = RANGES, python: bool = False) -> list[str]:
    """Per profiled step (or validation batch): host ms and CUDA runtime calls in each range of ``names``, and in
    the time between the first range's spans; then the ops with the most host time; with ``python`` (a window
    recorded ``with_stack``), each range's Python functions and ops by self time."""
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    ranges: dict[str, list[Any]] = {name: [e for e in events if e.name == _range(name)] for name in names}
    first = names[0]
    unit = UNIT[first]
    n = len(ranges[first])
    if n == 0:
        return [f"no {unit} was recorded"]
    # Between one span of the first range and the next: fetching the next batch, Lightning's loop.
    spans = sorted(ranges[first], key=lambda e: e.time_range.start)
    gaps = [(a.time_range.end, b.time_range.start) for a, b in itertools.pairwise(spans)]
    windows = {name: [(e.time_range.start, e.time_range.end) for e in found] for name, found in ranges.items()}
    windows[BETWEEN] = gaps
    calls: dict[str, Counter[str]] = defaultdict(Counter)
    sync_us: Counter[str] = Counter()
    call_us: dict[str, Counter[str]] = defaultdict(Counter)  # host time in each kind of call
    runtime = [e for e in events if e.name.startswith(("cuda", "cu")) and not e.name.startswith("cudnn")]
    for call in runtime:
        # By time, on any thread: autograd runs a CUDA backward on a thread of its own, while the training thread
        # waits inside the backward range.
        t = call.time_range.start
        for name, spans_of in windows.items():
            if any(lo <= t <= hi for lo, hi in spans_of):
                calls[name][call.name] += 1
                call_us[name][call.name] += call.time_range.elapsed_us()
                if call.name in SYNCS:
                    sync_us[name] += call.time_range.elapsed_us()
    lines = [f"{n} {_plural(unit, n)} profiled"]
    for name in names:
        found = ranges[name]
        if found:
            host_ms = sum(e.time_range.elapsed_us() for e in found) / 1e3 / len(found)
            lines += _census(name, UNIT[name], len(found), host_ms, calls[name], call_us[name], sync_us[name])
    if gaps:
        host_ms = sum(hi - lo for lo, hi in gaps) / 1e3 / len(gaps)
        census = _census(f"between {_plural(unit, 2)}", unit, len(gaps), host_ms, calls[BETWEEN], call_us[BETWEEN],
                         sync_us[BETWEEN])
        census[0] = census[0].replace(f"per {unit};", f"per {unit} (the next batch, Lightning's loop);", 1)
        lines += census
    if python:
        counts = {name: len(found) for name, found in ranges.items()}
        counts[BETWEEN] = len(gaps)
        units = {**{name: UNIT[name] for name in names}, BETWEEN: unit}
        lines += self_time_lines(events, windows, counts, units, top)
    averages = [a for a in prof.key_averages() if not a.key.startswith("## lit_icl")]
    averages.sort(key=lambda a: -a.self_cpu_time_total)
    shown = ", ".join(f"{a.key} {a.self_cpu_time_total / 1e3 / n:.2f} ms ({a.count / n:.1f}x)"
                      for a in averages[:top])
    lines.append(f"most host time per {unit} (self): {shown}")
    return lines


#: The header of :class:`PhaseProfiler`'s report; each row is ``| action | calls | total s | mean ms | median ms |``.
PHASE_HEADER = "| action | calls | total (s) | mean (ms) | median (ms) |"


#: The stage under which :class:`PhaseProfiler` records a garbage collection of ``generation``.
GC_PREFIX = "gc (generation "
GC_STAGE = GC_PREFIX + "{generation})"


class PhaseProfiler(SimpleProfiler):
    """Lightning's ``SimpleProfiler`` whose report gives each stage's calls, total, mean and median, by total time,
    with Python's garbage collections among the stages (:data:`GC_STAGE`) from ``setup`` to ``teardown``."""

    _gc_started = 0.0

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        if self._time_gc not in gc.callbacks:
            gc.callbacks.append(self._time_gc)

    def teardown(self, stage: str | None) -> None:
        # Lightning's describe() writes the summary before it calls this, so the report has every collection.
        if self._time_gc in gc.callbacks:
            gc.callbacks.remove(self._time_gc)
        super().teardown(stage)

    def _time_gc(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` hook: collections do not nest, and the GIL keeps start and stop on one thread."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            stage = GC_STAGE.format(generation=info["generation"])
            self.recorded_durations[stage].append(time.perf_counter() - self._gc_started)

    def summary(self) -> str:
        rows = sorted(((action, len(d), math.fsum(d), statistics.median(d))
                       for action, d in self.recorded_durations.items() if d), key=lambda r: -r[2])
        lines = [f"{(self._stage or '').upper()} phases".strip(), PHASE_HEADER, "|---|---|---|---|---|"]
        lines += [f"| {action} | {calls} | {total:.4f} | {1e3 * total / calls:.3f} | {1e3 * median:.3f} |"
                  for action, calls, total, median in rows]
        return "\n".join(lines) + "\n"


#: A row of :class:`PhaseProfiler`'s report, as :func:`phase_lines` reads it back.
_ROW = re.compile(r"^\| (.+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", re.MULTILINE)


def _short_action(action: str) -> str:
    """``[Callback]ModelCheckpoint{'monitor': 'val/acc', ...}.on_train_epoch_end`` ->
    ``ModelCheckpoint(monitor=val/acc).on_train_epoch_end``; ``[Strategy]X.validation_step`` -> ``validation_step``."""
    action = re.sub(r"\{'monitor': ([^,]+),[^}]*\}", lambda m: f"(monitor={m.group(1).strip(chr(39))})", action)
    action = re.sub(r"^\[(Strategy|_\w+Loop)\]\w*\.", "", action)
    return re.sub(r"^\[(Callback|LightningModule|LightningDataModule)\]", "", action)


def phase_lines(report: str, top: int) -> list[str]:
    """The ``top`` stages of a ``PhaseProfiler`` report by total time, then its garbage collections if they are not
    among them: ``name: total s (calls x mean ms, median median ms)``; the median leaves out what the first calls
    paid for compiling (:class:`PhaseProfiler`)."""
    rows = [(m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5)))
            for m in _ROW.finditer(report)]
    rows.sort(key=lambda r: -r[2])
    gc_rows = [r for r in rows[top:] if r[0].startswith(GC_PREFIX)]  # always shown
    return [f"{_short_action(name)}: {total:.2f} s ({calls} x {mean:.2f} ms, median {median:.2f} ms)"
            for name, calls, total, mean, median in rows[:top] + gc_rows]


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/step_trace.py``: a module of callbacks, not a run of its own; says how to use it."""
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="A module of callbacks, not a benchmark of its own: main_command.py --trace START:STEPS, "
               "--trace-val ROUND and --trace-python START:STEPS add them to a run; step_speed.py --phases and "
               "main_command.py --phases use PhaseProfiler.")
    parser.parse_args(argv)
    parser.error("nothing to run here; trace a run with: python benchmarks/main_command.py --config CONFIG "
                 "--trace START:STEPS (see --help)")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

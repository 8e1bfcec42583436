"""Callbacks that tests load by class path (``--trainer.callbacks``), into ``python -m lit_icl`` subprocesses or
into the CLI run in the test process.

Kept apart from ``conftest.py``, which pins the test process to one thread: importing it into a subprocess would
pin that run too.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path
from types import ModuleType

import torch
from lightning.pytorch import Callback
from torch.utils._python_dispatch import TorchDispatchMode


class KillAtStep(Callback):
    """Kills its own process with SIGKILL (no clean-up, no checkpoint) after optimizer step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAtStep(Callback):
    """Sends ``signum`` (SIGTERM: a cluster's preemption as one rank sees it; SIGINT: Ctrl-C) ``times`` times to its
    own process on rank ``rank`` (every rank when ``None``, as a terminal's Ctrl-C reaches them) after optimizer step
    ``step`` (never when ``step`` is ``None``), at the end of the epoch of that step when ``at_epoch_end``, or during
    the first
    batch of the validation round after that step when ``in_validation``, and appends ``<rank> <exception or "end">
    <global step>`` to ``path`` when the run ends."""

    def __init__(self, path: str, step: int | None = None, rank: int | None = 0, signum: str = "SIGTERM", times: int = 1,
                 in_validation: bool = False, at_epoch_end: bool = False):
        self.step, self.rank, self.path = step, rank, path
        self.signum, self.times, self.in_validation = getattr(signal, signum), times, in_validation
        self.at_epoch_end = at_epoch_end

    def _send(self, trainer) -> None:
        if trainer.global_step == self.step and self.rank in (trainer.global_rank, None):
            self.step = None  # once
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not (self.in_validation or self.at_epoch_end):
            self._send(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.at_epoch_end:  # Lightning then stops between this epoch and the next
            self._send(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.in_validation and batch_idx == 0 and not trainer.sanity_checking:
            self._send(trainer)

    def _record(self, trainer, what: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"{trainer.global_rank} {what} {trainer.global_step}\n")

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._record(trainer, type(exception).__name__)

    def on_train_end(self, trainer, pl_module) -> None:
        self._record(trainer, "end")


class CountBroadcasts(Callback):
    """Counts the calls to ``torch.distributed.broadcast`` and ``broadcast_object_list`` (what Lightning 2.6 calls
    at every training batch under DDP) from the end of batch ``start`` to the first of: the end of batch ``stop``,
    a validation round, the epoch's end, a failure; then appends ``<rank> <calls> <batches>`` to ``path``."""

    def __init__(self, path: str, start: int = 3, stop: int = 30):
        self.path, self.start, self.stop = path, start, stop
        self.calls, self.batches, self._saved = 0, 0, None

    def _count(self, fn):
        def counted(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)
        return counted

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == self.start:
            dist = torch.distributed
            self._saved = (dist.broadcast, dist.broadcast_object_list)
            dist.broadcast, dist.broadcast_object_list = map(self._count, self._saved)
        elif self._saved is not None:
            self.batches += 1
            if batch_idx == self.stop:
                self._close(trainer)

    def _close(self, trainer) -> None:
        if self._saved is None:
            return
        torch.distributed.broadcast, torch.distributed.broadcast_object_list = self._saved
        self._saved = None
        with open(self.path, "a") as fh:
            fh.write(f"{trainer.global_rank} {self.calls} {self.batches}\n")

    def on_validation_start(self, trainer, pl_module) -> None:
        self._close(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._close(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close(trainer)


class NanOnRank(Callback):
    """Makes rank ``rank``'s first parameter NaN before optimizer step ``step`` + 1 (the other ranks keep theirs):
    a training loss that is not finite on one rank only. ``deferred``: the run's ``FiniteGuard`` keeps each loss
    on the device and reads it later, as it does on a GPU."""

    def __init__(self, step: int, rank: int, deferred: bool = False):
        self.step, self.rank = step, rank
        if deferred:
            from lit_icl.callbacks.finite import FiniteGuard

            FiniteGuard._defers = staticmethod(lambda device: True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


class StopAtStep(Callback):
    """Stops training after optimizer step ``step`` the way ``--trainer.max_time`` does (``trainer.should_stop``
    at a batch's end): Lightning then validates, runs the epoch-end hooks and saves its checkpoints."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


class FailAtStep(Callback):
    """Raises ``RuntimeError`` after optimizer step ``step``: a crash that a run in the test process survives."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"FailAtStep: crashed after step {self.step}")


class TraceSteps(Callback):
    """Debug aid: appends ``step threads weight-sum grad-sum`` after every backward pass to ``path``."""

    def __init__(self, path: str):
        self.path = path

    def on_after_backward(self, trainer, pl_module) -> None:
        g = sum(float(p.grad.double().sum()) for p in pl_module.parameters() if p.grad is not None)
        w = sum(float(p.double().sum()) for p in pl_module.parameters())
        with open(self.path, "a") as fh:
            fh.write(f"{trainer.global_step} {torch.get_num_threads()} {w:.10f} {g:.10f}\n")


class ScriptedMetric(Callback):
    """Logs ``name`` with the ``i``-th of ``values`` at the ``i``-th validation round (the last value after that):
    a validation metric whose improvements fall on known rounds, for tests of the stopping rule."""

    def __init__(self, values: list[float], name: str = "scripted"):
        self.values, self.name, self.round = values, name, 0

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        pl_module.log(self.name, self.values[min(self.round, len(self.values) - 1)])
        self.round += 1


class NoDeviceWaits(Callback):
    """Makes every CUDA device sync an error from the end of training batch ``start`` to the end of batch
    ``stop`` (``torch.cuda.set_sync_debug_mode``): the transfers, the steps and Lightning's bookkeeping between
    them. Keep logging steps, checkpoints and epoch ends out of that window; they read values back on purpose.

    The window also runs under the profiler, and a copy to the GPU from pageable host memory in it fails the run
    at its end: CUDA may make the host wait for such a copy, which the sync check does not see."""

    def __init__(self, start: int = 2, stop: int = 6):
        self.start, self.stop = start, stop
        self._profile: torch.profiler.profile | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.device.type != "cuda":  # nothing to check off a GPU
            return
        if batch_idx == self.start:
            # Started before the sync check and stopped after it: the profiler synchronizes at both ends.
            self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._profile.start()
            torch.cuda.set_sync_debug_mode("error")
        elif batch_idx == self.stop:
            torch.cuda.set_sync_debug_mode("default")
            self._profile.stop()
            # Kineto names copies by memory kind, e.g. "Memcpy HtoD (Pageable -> Device)".
            pageable = sorted({e.name for e in self._profile.events() if "Pageable" in e.name})
            if pageable:
                raise AssertionError(f"training batches {self.start + 1}-{self.stop} copied from pageable host "
                                     f"memory: {pageable}; pin it (lit_icl.core.transfer)")

    def on_exception(self, trainer, pl_module, exception) -> None:
        if torch.cuda.is_initialized():
            torch.cuda.set_sync_debug_mode("default")


def _step_trace() -> ModuleType:
    """``benchmarks/step_trace.py`` as a module (loaded once; it is a script, not part of a package)."""
    module = sys.modules.get("step_trace")
    if module is None:
        spec = importlib.util.spec_from_file_location("step_trace", Path(__file__).resolve().parents[1]
                                                      / "benchmarks/step_trace.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["step_trace"] = module
        spec.loader.exec_module(module)
    return module


class BackwardLaunches(Callback):
    """After the first validation round, profiles up to ``steps`` backward passes (``on_before_backward`` to
    ``on_after_backward``, every thread: autograd runs a GPU backward on a thread of its own) and appends
    ``<graph launches> <kernel launches>`` per backward to ``path``. A backward replayed as a CUDA graph makes a
    graph launch and few kernel launches of its own; one run uncaptured launches each of its kernels from the host,
    and its library calls cost host time each (about 90 us per matrix product on the H200 machine of 2026-11-26)."""

    def __init__(self, path: str, steps: int = 3):
        self.path, self.steps = path, steps
        self._armed, self._done = False, 0
        self._profile: torch.profiler.profile | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._armed = True

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self._armed and self._done < self.steps:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if pl_module.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities)
            self._profile.start()

    def on_after_backward(self, trainer, pl_module) -> None:
        if self._profile is None:
            return
        self._profile.stop()
        names = [event.name for event in self._profile.events()]
        self._profile, self._done = None, self._done + 1
        trace = _step_trace()  # the CUDA calls benchmarks/step_trace.py counts as graph and kernel launches
        graphs = sum(names.count(name) for name in trace.GRAPH_LAUNCHES)
        kernels = sum(names.count(name) for name in trace.KERNEL_LAUNCHES)
        with open(self.path, "a") as fh:
            fh.write(f"{graphs} {kernels}\n")


class CompiledGraphs(Callback):
    """Appends ``<where> <graphs>`` to ``path`` at the start of training and the end of every validation round:
    how many graphs ``torch.compile`` has made so far in this process (dynamo's own count). With ``round_starts``,
    also at the start of every validation round, which tells the graphs of training from those of evaluation."""

    def __init__(self, path: str, round_starts: bool = False):
        self.path = path
        self.round_starts = round_starts

    def _record(self, where: str) -> None:
        from torch._dynamo.utils import counters

        with open(self.path, "a") as fh:
            fh.write(f"{where} {counters['stats']['unique_graphs']}\n")

    def on_train_start(self, trainer, pl_module) -> None:
        self._record("train_start")

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.round_starts and not trainer.sanity_checking:
            self._record(f"validation_start_{trainer.global_step}")

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._record(f"validation_end_{trainer.global_step}")




class _OpNames(TorchDispatchMode):
    """Adds the name (``name.overload``) of every aten op that runs while it is active to ``ops``; the ops whose
    arguments decide whether CUDA's deterministic mode refuses them or takes a slow path are named with those:
    ``index_put(accumulate)``, ``bincount(weights)``, ``scatter_reduce(<reduce>)``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__
        base = name.split(".")[0]
        if base in ("index_put", "index_put_", "_index_put_impl_") and (
                kwargs.get("accumulate") or (len(args) > 3 and args[3])):
            name = "index_put(accumulate)"
        elif base == "bincount" and (kwargs.get("weights") is not None or (len(args) > 1 and args[1] is not None)):
            name = "bincount(weights)"
        elif base.startswith("scatter_reduce"):
            name = f"scatter_reduce({kwargs.get('reduce', args[3] if len(args) > 3 else '')})"
        self.ops.add(name)
        return func(*args, **kwargs)


class AtenOps(Callback):
    """Writes to ``path``, one per line and sorted, the aten ops (:class:`_OpNames`) that the training batches
    (step, backward and update) and the validation batches (step and the batch-end hooks of the callbacks before
    this one) run."""

    def __init__(self, path: str):
        self.path, self._mode = path, _OpNames()

    def _start(self, *args) -> None:
        self._mode.__enter__()

    def _end(self, *args) -> None:
        self._mode.__exit__(None, None, None)
        with open(self.path, "w") as fh:
            fh.write("".join(f"{name}\n" for name in sorted(self._mode.ops)))

    on_train_batch_start = on_validation_batch_start = _start
    on_train_batch_end = on_validation_batch_end = _end


class SignalInEvaluation(Callback):
    """Sends ``signum`` to its own process after the first batch of a ``test`` or ``validate`` run (not of a fit's
    validation rounds), as a preemption or ``timeout`` does to an evaluation of a checkpoint; with ``sanity``, after
    the first batch of a fit's sanity check instead."""

    def __init__(self, signum: str = "SIGTERM", sanity: bool = False):
        self.signum, self.sanity = getattr(signal, signum), sanity

    def _send(self, trainer, batch_idx: int) -> None:
        wanted = trainer.sanity_checking if self.sanity else trainer.state.fn in ("test", "validate")
        if batch_idx == 0 and wanted:
            os.kill(os.getpid(), self.signum)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._send(trainer, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._send(trainer, batch_idx)

"""``HostReadCensus``: where a GPU run of a config would make its host wait, counted on any device.

A GPU keeps busy while the host queues kernels ahead of it. A read of a device value on the host (``item()``,
``bool(t)``, ``tolist()``, boolean-mask indexing, ...) stops the host until the device has caught up, and the
host time of Lightning and of the step then adds to the GPU's instead of hiding behind it. This callback counts
those reads (:class:`lit_icl.core.syncs.HostReads`) per training step and per validation round, on the CPU as
well, so a read added to a step shows up in a CPU test rather than as lost speed on the next GPU:

    python -m lit_icl fit --config configs/icssl/manifolds.yaml --trainer.max_steps 6 \\
        --trainer.callbacks+=lit_icl.callbacks.HostReadCensus

``benchmarks/host_reads.py`` runs it over every paper's main config.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lit_icl.callbacks.finite import FiniteGuard
from lit_icl.core import spectral
from lit_icl.core.syncs import HostReads, not_counted
from lit_icl.core.validation import check_bool, check_int
from lit_icl.metrics.representation import _MeanOverSets

__all__ = ["HostReadCensus", "HostReadInStep", "as_on_cuda"]


@contextmanager
def as_on_cuda() -> Iterator[None]:
    """Take the project's CUDA branches on any device, so a census on the CPU counts what a GPU run reads.

    - Adam/AdamW are built with ``fused=True`` (:func:`lit_icl.core.optim.fused_if_cuda`): the CPU's default
      update reads each parameter's step count (a host tensor in a GPU run), the fused one reads nothing;
    - :class:`~lit_icl.callbacks.finite.FiniteGuard` keeps each loss on the device until a logging step instead
      of reading it at once;
    - ``eigh`` of a batch of matrices larger than 32 x 32 goes through the host, as
      :func:`lit_icl.core.spectral.eigh_on_host` sends it on a GPU;
    - ``F.one_hot(x, num_classes)`` does not count the two reads it makes on a CPU only (on CUDA, torch checks
      the class range with a device-side assert instead);
    - the representation metrics add undefined (NaN) set scores as 0 instead of dropping them with a mask.

    The fused update rounds differently from the CPU's default one, so a run inside gives the same reads as on a
    GPU, not the same numbers as a CPU run.
    """
    for package in ("lit_icl.icssl", "lit_icl.coqe", "lit_icl.mmca", "lit_icl.i2cl"):
        importlib.import_module(package)  # each paper's module, so that its own name for fused_if_cuda is patched
    original_eigh, original_one_hot = spectral.eigh_on_host, F.one_hot

    def fused(params: Any) -> dict[str, bool]:
        return {"fused": True}

    def eigh_on_host(shape: Any, device: torch.device) -> bool:
        return original_eigh(shape, torch.device("cuda"))

    def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
        if num_classes < 0:  # the class count is read from the data on every device
            return original_one_hot(tensor, num_classes)
        with not_counted():
            return original_one_hot(tensor, num_classes)

    patches: list[tuple[Any, str, Any]] = [
        (module, "fused_if_cuda", fused)
        for name, module in list(sys.modules.items())
        if name.startswith("lit_icl.") and "fused_if_cuda" in vars(module)
    ]
    patches += [
        (FiniteGuard, "_defers", staticmethod(lambda device: True)),
        (_MeanOverSets, "_drops_by_mask", staticmethod(lambda device: False)),
        (spectral, "eigh_on_host", eigh_on_host),
        (F, "one_hot", one_hot),
    ]
    saved = [(obj, attr, vars(obj)[attr]) for obj, attr, _ in patches]
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)


#: The windows counted, in the order they are reported.
WINDOWS = ("step", "update", "logging step", "val batch", "val round")


class HostReadInStep(RuntimeError):
    """A training step that is not a logging step read a device value on the host (``strict=True``)."""


class HostReadCensus(Callback):
    """Count the host reads of each training step, validation batch and validation round of a run.

    Windows (each a ``Counter`` of read kinds per occurrence, in :attr:`windows`):

    - ``step``: a training step that is not a logging step, from the batch's arrival on the device
      (``on_after_batch_transfer``) to Lightning's end of the batch (the callbacks' hooks, the parameter update
      and Lightning's bookkeeping of the batch included); the goal is 0;
    - ``update``: the part of each step after ``on_before_optimizer_step`` (the parameter update);
    - ``logging step``: a step whose logged values Lightning writes (it reads them then);
    - ``val batch``: a validation step, from the batch's arrival on the device to Lightning's end of it;
    - ``val round``: from ``on_validation_start`` until training resumes (epoch-end hooks, written values and
      the checkpoints saved after validation included).

    Args:
        warmup: training steps not counted at the start (state made lazily on the first steps).
        strict: raise :class:`HostReadInStep` at the first counted step that is not a logging step and reads,
            naming where it read.
        cuda_branches: take the project's CUDA branches for the run (:func:`as_on_cuda`), so
            that a census on the CPU counts a GPU run's reads. The run's numbers then differ from a CPU run's
            (fused Adam), so use a census run for counting only.
        sites: record where each read is asked for (:attr:`sites`, and in the summary).
    """

    def __init__(self, warmup: int = 1, strict: bool = False, cuda_branches: bool = True, sites: bool = False) -> None:
        self.warmup = check_int("HostReadCensus warmup", warmup, minimum=0, hint="the steps not counted at the start")
        self.strict = check_bool("HostReadCensus strict", strict)
        self.cuda_branches = check_bool("HostReadCensus cuda_branches", cuda_branches)
        self.record_sites = check_bool("HostReadCensus sites", sites)
        self.windows: dict[str, list[Counter[str]]] = {w: [] for w in WINDOWS}
        #: window -> (kind, "file:line in function") -> calls, with ``sites=True``.
        self.sites: dict[str, Counter[tuple[str, str]]] = {w: Counter() for w in WINDOWS}
        self._patches: ExitStack | None = None
        self._step: HostReads | None = None
        self._round: HostReads | None = None
        self._mark: Counter[str] = Counter()
        self._update: Counter[str] = Counter()
        self._transfer = HostReads(sites=sites)  # the reads of the latest batch's on_after_batch_transfer

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Before configure_optimizers, which builds the (fused on CUDA) optimizer.
        if self.cuda_branches and self._patches is None:
            self._patches = ExitStack()
            self._patches.enter_context(as_on_cuda())

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Lightning skips teardown when a run fails: leave no mode active and no branch patched.
        self._restore()

    def _restore(self) -> None:
        for mode in (self._step, self._round):
            if mode is not None:
                mode.__exit__(None, None, None)
        self._step = self._round = None
        if self._patches is not None:
            self._patches.close()
            self._patches = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning's logger connector opens and closes each batch around every callback's batch hooks, so the
        # windows start and end there whatever this callback's place in the list.
        connector = trainer._logger_connector
        batch_start, batch_end, write = (
            connector.on_batch_start, connector.on_batch_end, connector.update_train_step_metrics
        )

        def on_batch_start(*args: Any, **kwargs: Any) -> None:
            transfer, self._transfer = self._transfer, HostReads(sites=self.record_sites)
            if trainer.training and not trainer.validating and trainer.global_step >= self.warmup:
                self._close_round()
                self._step = self._open()
                self._step.counts.update(transfer.counts)
                if self._step.sites is not None:
                    self._step.sites.update(transfer.sites or {})
            elif self._round is not None:
                # The round's mode counted the transfer too: the batch's window starts before it.
                self._mark = self._round.counts - transfer.counts
            batch_start(*args, **kwargs)

        def on_batch_end(*args: Any, **kwargs: Any) -> None:
            batch_end(*args, **kwargs)
            if self._round is not None and trainer.validating:
                self.windows["val batch"].append(self._round.counts - self._mark)

        def update_train_step_metrics(*args: Any, **kwargs: Any) -> None:
            write(*args, **kwargs)
            self._close_step(trainer)

        connector.on_batch_start = on_batch_start
        connector.on_batch_end = on_batch_end
        connector.update_train_step_metrics = update_train_step_metrics
        # A batch is on the host until it has been moved to the device: reads before the move wait for nothing.
        # What is done to it on the device afterwards (CoQE gathers its images there) belongs to its step.
        for owner in (trainer.datamodule, pl_module):
            if owner is not None and hasattr(owner, "on_before_batch_transfer"):
                owner.on_before_batch_transfer = _not_counted(owner.on_before_batch_transfer)
            if owner is not None and hasattr(owner, "on_after_batch_transfer"):
                owner.on_after_batch_transfer = self._counted_transfer(owner.on_after_batch_transfer)

    def _counted_transfer(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            mode = HostReads(sites=self.record_sites)
            with mode:
                out = hook(*args, **kwargs)
            self._transfer.counts.update(mode.counts)
            if mode.sites is not None and self._transfer.sites is not None:
                self._transfer.sites.update(mode.sites)
            return out

        return wrapper

    def _open(self) -> HostReads:
        mode = HostReads(sites=self.record_sites)
        mode.__enter__()
        return mode

    # ------------------------------------------------------------------ training steps
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        # Lightning calls it once the step's forward and backward have run: the parameter update follows.
        if self._step is not None:
            self._mark = Counter(self._step.counts)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._step is not None:
            self._update = self._step.counts - self._mark

    def _close_step(self, trainer: Trainer) -> None:
        mode, self._step = self._step, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        # global_step already counts the step just run; Lightning wrote its values if the count is a multiple.
        logged = trainer.global_step % max(int(trainer.log_every_n_steps), 1) == 0
        window = "logging step" if logged else "step"
        self.windows[window].append(mode.counts)
        self.windows["update"].append(self._update)
        self._update = Counter()
        if mode.sites is not None:
            self.sites[window].update(mode.sites)
        if self.strict and not logged and mode.counts:
            where = ", ".join(f"{kind} at {_short(site)}" for kind, site in (mode.sites or {})) or (
                ", ".join(mode.counts) + "; pass sites=True to see where"
            )
            raise HostReadInStep(
                f"training step {trainer.global_step - 1} read device values on the host ({where}); on a GPU each "
                "read makes the step wait for the device: keep the values on the device until a logging step "
                "(ICLModule.logging_step)"
            )

    # ------------------------------------------------------------------ validation
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._round = self._open()

    def _close_round(self) -> None:
        mode, self._round = self._round, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        self.windows["val round"].append(mode.counts)
        if mode.sites is not None:
            self.sites["val round"].update(mode.sites)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close_round()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close_round()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rank_zero_info(self.summary())

    # ------------------------------------------------------------------ report
    def means(self) -> dict[str, tuple[float, Counter[str], int]]:
        """``window -> (mean reads, mean reads by kind, occurrences)``."""
        out = {}
        for window, counts in self.windows.items():
            total: Counter[str] = Counter()
            for c in counts:
                total.update(c)
            n = max(len(counts), 1)
            out[window] = (sum(total.values()) / n, Counter({k: v / n for k, v in total.items()}), len(counts))
        return out

    def summary(self) -> str:
        """The census as text: the mean reads of each window, by kind, and (``sites=True``) where they were made."""
        lines = ["lit_icl: host reads (each one makes a GPU run wait for its device)"]
        for window, (mean, kinds, n) in self.means().items():
            shown = ", ".join(f"{k} {v:g}" for k, v in kinds.most_common()) or "-"
            lines.append(f"  {window:13s} {mean:7.1f} per occurrence ({n} counted)  {shown}")
            for (kind, site), calls in self.sites[window].most_common():
                lines.append(f"      {calls:5d} x {kind} at {_short(site)}")
        return "\n".join(lines)


def _not_counted(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with not_counted():
            return hook(*args, **kwargs)

    return wrapper


def _short(site: str) -> str:
    """A site as a path below the working directory (the project's files) or below ``site-packages``."""
    path, sep, rest = site.partition(":")
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1] + sep + rest
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return (rel if not rel.startswith("..") else path) + sep + rest

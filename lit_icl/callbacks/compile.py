"""``CompileNets``: ``torch.compile`` for a paper's nets, with CUDA-graph capture on a GPU (``--compile.mode``).

Our nets are small: on a GPU a training step costs what its kernel launches cost, not its arithmetic (IC-SSL's
step: about 1,400 launches for 5 ms of GPU work). Compiling fuses those launches; ``mode="reduce-overhead"``
also records each compiled graph as a CUDA graph and replays it with one launch.

What is compiled is each net a module calls, never Lightning's loop: the modules name them in
:meth:`lit_icl.core.module.ICLModule.compile_targets` (the net by default; IC-SSL's representation and head,
which evaluation calls one by one). Each target is compiled *in place* (``nn.Module.compile``), so parameter
names do not change: a checkpoint written with compilation loads without it and the other way round, and
resuming may switch compilation on or off.

CUDA graphs reuse their output memory at every replay. The callback marks the start of every training,
validation, test and predict batch (``torch.compiler.cudagraph_mark_step_begin``), which tells the graphs that
the previous batch's outputs are no longer read. What a module keeps across batches (torchmetrics states,
logged values) is computed from those outputs in eager code and so owns its memory.

Numbers: compiled kernels fuse and reorder floating-point operations, so a compiled run agrees with the eager
run of the same seed to rounding (``tests/test_compile.py`` states the tolerance), not bit for bit. Eager runs are
unchanged and stay bit-identical.

What compilation cost is reported as it happens (:class:`CompileLedger`): graphs traced, backward graphs compiled
on first use and CUDA graphs recorded, with their seconds, and any graph that inductor runs without a CUDA graph
although the mode asked for one, with inductor's reason (on a GPU each call of such a graph launches its kernels
from the host); logged as ``compile/*`` at every validation round and summed up in one line at the end of the
run. A healthy run compiles and records everything by the end of its first validation round; work after it (a
recompile, a CUDA graph recorded again) is named in that line, since on a GPU each costs from milliseconds to
seconds at every occurrence.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule

#: ``off``, ``auto`` (``reduce-overhead`` on a CUDA device, eager elsewhere), or a mode of ``torch.compile``;
#: ``reduce-overhead`` and ``max-autotune`` capture CUDA graphs on a GPU.
CompileMode = Literal["off", "auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
#: Modes whose graphs run as CUDA graphs on a GPU (and so need the step marker).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


#: How the line that sums up a run's compiling starts (:meth:`CompileLedger.describe`); benchmarks read it back.
COMPILATION_LINE = "lit_icl: compilation in this run"


def inductor_supports(device: torch.device) -> bool:
    """Whether inductor generates code for this CUDA device: Triton installed and compute capability 7.0 or newer
    (older GPUs, such as a P100, make ``torch.compile`` fail at the first step)."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (7, 0)


def resolve_mode(mode: str, device: torch.device, pl_module: LightningModule | None = None) -> str:
    """The ``torch.compile`` mode that ``mode`` means on ``device`` for ``pl_module``.

    ``auto`` (the CLI's default): ``reduce-overhead`` on a CUDA GPU that inductor supports, ``off`` elsewhere; and
    ``off`` everywhere for a module whose ``compile_auto`` is False (I2CL, whose compilation costs more than its
    calibration takes).
    """
    if mode == "auto":
        if not getattr(pl_module, "compile_auto", True) or device.type != "cuda":
            return "off"
        return "reduce-overhead" if inductor_supports(device) else "off"
    return mode


try:  # torch >= 2.7 reports why it compiles; older versions leave the ledger empty
    from torch._dynamo.callback import CallbackArgs, callback_handler
except ImportError:  # pragma: no cover - depends on the installed torch
    callback_handler = None

#: The work torch reports through dynamo's compile callbacks, by trigger: a frame traced and compiled, a
#: backward graph compiled at its first use, a CUDA graph recorded (``reduce-overhead`` on a GPU).
LEDGER_KINDS = {"DYNAMO": "graphs", "LAZY_BACKWARD": "backward_graphs", "CUDAGRAPH_RECORDING": "cuda_graphs"}
#: A compiled graph that inductor runs without a CUDA graph, although the mode asked for one: every call of it
#: launches its kernels from the host, which is what CUDA graphs are there to avoid (counted, not timed).
SKIPS = "cuda_graph_skips"
#: How the summary line names one and several pieces of each kind of work.
_SAID = {"graphs": ("graph compiled", "graphs compiled"),
         "backward_graphs": ("backward graph compiled", "backward graphs compiled"),
         "cuda_graphs": ("CUDA graph recorded", "CUDA graphs recorded"),
         SKIPS: ("graph run without CUDA graphs", "graphs run without CUDA graphs")}
#: Where inductor says that it runs a graph without CUDA graphs ("skipping cudagraphs due to <reason>"), once per
#: graph and reason: the ``cudagraphs`` log artifact, shown by default (torch >= 2.6), or before it the
#: ``perf_hints`` artifact, hidden unless ``TORCH_LOGS=perf_hints``. The ledger listens to both.
CUDAGRAPH_SKIP_LOGGERS = ("torch._inductor.cudagraph_utils.__cudagraphs",
                          "torch._inductor.cudagraph_utils.__perf_hints")


def skip_reason(message: str) -> str:
    """The reason of inductor's "skipping cudagraph(s) due to <reason>. Found from : <stack>" in one line."""
    reason = message.split("due to", 1)[-1].split("Found from", 1)[0].strip().rstrip(".")
    return " ".join(reason.split())


class _SkipListener(logging.Handler):
    """Hands each of inductor's CUDA-graph skip messages to a :class:`CompileLedger`."""

    def __init__(self, ledger: CompileLedger) -> None:
        super().__init__(logging.WARNING)
        self.ledger = ledger

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("skipping cudagraph"):  # perf_hints carries other hints too
            self.ledger.skipped(skip_reason(message))


class CompileLedger:
    """Counts and times ``torch.compile``'s work in this process as it happens (dynamo's compile callbacks).

    ``counts`` and ``seconds`` are keyed by the values of :data:`LEDGER_KINDS`. Only the work of the outermost
    trigger is counted (torch runs the callbacks once for nested compilations). ``counts[SKIPS]`` counts the graphs
    inductor runs without CUDA graphs (it says so in its log, :data:`CUDAGRAPH_SKIP_LOGGERS`), with their reasons
    in ``skip_reasons``.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        #: Why inductor ran graphs without CUDA graphs, with how often each reason was given.
        self.skip_reasons: Counter[str] = Counter()
        self._started: float | None = None
        self._installed = False
        self._listener = _SkipListener(self)

    def _start(self, args: CallbackArgs) -> None:
        self._started = time.perf_counter()

    def _end(self, args: CallbackArgs) -> None:
        kind = LEDGER_KINDS.get(args.callback_trigger.name)
        if kind is not None and self._started is not None:
            self.counts[kind] += 1
            self.seconds[kind] += time.perf_counter() - self._started
        self._started = None

    def skipped(self, reason: str) -> None:
        """Record one graph that runs without CUDA graphs, and why (inductor's words)."""
        self.counts[SKIPS] += 1
        self.skip_reasons[reason] += 1

    @property
    def active(self) -> bool:
        """Whether it is counting."""
        return self._installed

    def install(self) -> None:
        """Start counting (once); a torch without compile callbacks counts nothing."""
        if callback_handler is not None and not self._installed:
            callback_handler.register_start_callback(self._start)
            callback_handler.register_end_callback(self._end)
            for name in CUDAGRAPH_SKIP_LOGGERS:
                logging.getLogger(name).addHandler(self._listener)
            self._installed = True

    def remove(self) -> None:
        """Stop counting. ``torch._dynamo.reset()`` may have dropped the callbacks already."""
        if self._installed:
            for registered, callback in ((callback_handler.start_callbacks, self._start),
                                         (callback_handler.end_callbacks, self._end)):
                if callback in registered:
                    registered.remove(callback)
            for name in CUDAGRAPH_SKIP_LOGGERS:
                logging.getLogger(name).removeHandler(self._listener)
            self._installed = False

    def snapshot(self) -> tuple[Counter[str], dict[str, float]]:
        return Counter(self.counts), dict(self.seconds)

    def metrics(self) -> dict[str, float]:
        """``compile/<kind>`` counts (graphs run without CUDA graphs included) and ``compile/seconds``."""
        out = {f"compile/{kind}": float(self.counts[kind]) for kind in (*LEDGER_KINDS.values(), SKIPS)}
        out["compile/seconds"] = float(sum(self.seconds.values()))
        return out

    def _describe(self, counts: Counter[str], seconds: dict[str, float], reasons: bool = True) -> str:
        parts = [f"{counts[kind]} {_SAID[kind][counts[kind] != 1]} ({seconds.get(kind, 0.0):.1f} s)"
                 for kind in LEDGER_KINDS.values() if counts[kind]]
        if counts[SKIPS]:
            # Inductor's reasons, which a user acts on (a few at most); said once, in the line's first part.
            why = f" ({'; '.join(self.skip_reasons)})" if reasons else ""
            parts.append(f"{counts[SKIPS]} {_SAID[SKIPS][counts[SKIPS] != 1]}{why}")
        return ", ".join(parts) or "none"

    def describe(self, since: tuple[Counter[str], dict[str, float]] | None = None) -> str:
        """One line: the work so far, and (``since`` a :meth:`snapshot`) the work after it."""
        line = f"{COMPILATION_LINE}: {self._describe(self.counts, self.seconds)}"
        if since is not None:
            counts, seconds = since
            later = self.counts - counts
            later_s = {k: self.seconds[k] - seconds.get(k, 0.0) for k in later}
            line += f"; after the first validation round: {self._describe(later, later_s, reasons=False)}"
            if later:
                line += " (each recurs as often as its cause; TORCH_LOGS=recompiles,cudagraphs names it)"
        if self.counts[SKIPS]:
            line += ("; a graph run without CUDA graphs launches its kernels from the host at every call "
                     "(TORCH_LOGS=cudagraphs says where in the code)")
        return line


def compile_targets(pl_module: LightningModule) -> list[nn.Module]:
    """The nets of ``pl_module`` to compile: its ``compile_targets()`` (every :class:`ICLModule` has one), else
    its ``net``."""
    if isinstance(pl_module, ICLModule):
        return pl_module.compile_targets()
    net = getattr(pl_module, "net", None)
    if not isinstance(net, nn.Module):
        raise ConfigError(f"{type(pl_module).__name__} has no `net` to compile; run without --compile.mode")
    return [net]


class CompileNets(Callback):
    """Compile the module's nets once, before the first stage runs; mark each batch for CUDA graphs.

    Args:
        mode: a ``torch.compile`` mode (``default``, ``reduce-overhead``, ``max-autotune``,
            ``max-autotune-no-cudagraphs``), or ``auto`` (the CLI's default): ``reduce-overhead`` when the run's
            device is a CUDA GPU that inductor supports, eager (nothing compiled) elsewhere, since on a CPU a step
            is arithmetic and eager is bit-identical run to run (``docs/usage.md`` has the measurements).
        backend: a ``torch.compile`` backend (``inductor``; ``aot_eager`` and ``eager`` compile nothing and
            serve to check tracing quickly). Modes only apply to ``inductor``.
        fullgraph: fail on a graph break instead of splitting the net into several graphs (our nets have none;
            ``tests/test_compile.py`` checks every paper's).
        dynamic: let one compiled graph serve several input shapes; ``False`` compiles one graph per shape,
            which is what CUDA graphs need (a step's shapes are fixed by the config; the last, smaller batch of
            an evaluation set costs one more compilation). ``"module"`` (default): the module's
            ``compile_dynamic`` (``False`` for every paper but I2CL, whose prompt lengths vary).
    """

    def __init__(
        self, mode: CompileMode = "default", backend: str = "inductor", fullgraph: bool = False,
        dynamic: bool | Literal["module"] | None = "module",
    ) -> None:
        if mode not in CompileMode.__args__ or mode == "off":  # type: ignore[attr-defined]
            raise ConfigError(f"--compile.mode {mode!r} is not a compile mode; choose one of "
                              f"{', '.join(m for m in CompileMode.__args__ if m != 'off')}")  # type: ignore[attr-defined]
        check_backend(backend)
        self.mode, self.backend, self.fullgraph, self.dynamic = mode, backend, fullgraph, dynamic
        self._compiled: set[int] = set()
        self._mark = False
        #: What compilation has cost so far in this run (logged as ``compile/*``, summed up at the end).
        self.ledger = CompileLedger()
        self._after_first_round: tuple[Counter[str], dict[str, float]] | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        device = trainer.strategy.root_device
        resolved = resolve_mode(self.mode, device, pl_module)
        if resolved == "off":
            return
        self.ledger.install()
        nets = compile_targets(pl_module)
        # torch.compile's mode names inductor options; other backends take none.
        mode = resolved if self.backend == "inductor" else None
        dynamic = getattr(pl_module, "compile_dynamic", False) if self.dynamic == "module" else self.dynamic
        for net in nets:
            if id(net) in self._compiled:
                continue
            net.compile(backend=self.backend, mode=mode, fullgraph=self.fullgraph, dynamic=dynamic)
            self._compiled.add(id(net))
        names = ", ".join(type(net).__name__ for net in nets) or "nothing"
        rank_zero_info(f"lit_icl: compiled {names} (torch.compile backend={self.backend}, mode={mode})")
        self._mark = device.type == "cuda" and mode in CUDA_GRAPH_MODES

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not self.ledger.active:
            return
        if self._after_first_round is None:
            self._after_first_round = self.ledger.snapshot()
        for logger in trainer.loggers:  # host numbers: no device sync
            logger.log_metrics(self.ledger.metrics(), step=trainer.global_step)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.ledger.active:
            rank_zero_info(self.ledger.describe(self._after_first_round if stage == "fit" else None))
            self.ledger.remove()

    def _step_begin(self) -> None:
        if self._mark:
            # The previous batch's graph outputs are not read any more; the graphs may reuse their memory.
            torch.compiler.cudagraph_mark_step_begin()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_begin()

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._step_begin()

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._step_begin()

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._step_begin()


#: Backends every torch has: checking one of these needs no look at the registry.
BUILT_IN_BACKENDS = frozenset({"inductor", "eager", "aot_eager"})


def check_backend(backend: str) -> str:
    """Refuse a ``torch.compile`` backend this torch does not have, naming the ones it has."""
    if isinstance(backend, str) and backend in BUILT_IN_BACKENDS:
        # Listing the registry imports every backend's module: 0.4 s that every command would pay for the default.
        return backend
    known = set(torch._dynamo.list_backends(exclude_tags=())) | BUILT_IN_BACKENDS
    if not isinstance(backend, str) or backend not in known:
        raise ConfigError(f"--compile.backend {backend!r} is not a torch.compile backend here; choose one of "
                          f"{', '.join(sorted(known))}")
    return backend

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
"""

from __future__ import annotations

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
            ``tests/core/test_compile.py`` checks every paper's).
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

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        device = trainer.strategy.root_device
        resolved = resolve_mode(self.mode, device, pl_module)
        if resolved == "off":
            return
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


def check_backend(backend: str) -> str:
    """Refuse a ``torch.compile`` backend this torch does not have, naming the ones it has."""
    known = set(torch._dynamo.list_backends(exclude_tags=())) | {"inductor", "eager", "aot_eager"}
    if not isinstance(backend, str) or backend not in known:
        raise ConfigError(f"--compile.backend {backend!r} is not a torch.compile backend here; choose one of "
                          f"{', '.join(sorted(known))}")
    return backend

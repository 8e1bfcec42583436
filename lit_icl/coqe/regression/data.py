"""Regression prompts for in-context learning of function classes (CoQE paper Sec. 5.1, App. C.1; Garg et al. 2022).

A prompt is ``x_1, f(x_1), ..., x_n, f(x_n)`` for one function ``f`` drawn per prompt. Function classes (App. C.1):

- ``linear``: ``f(x) = w^T x``, ``w ~ N(0, I_d)`` (d = 10);
- ``sparse``: as linear, then all but ``s`` coordinates of ``w`` zeroed, chosen uniformly (d = 10, s = 3);
- ``relu``: ``f(x) = sum_i a_i ReLU(w_i^T x)``, ``a_i ~ N(0, 2/h)`` per prompt, the first layer ``w_i ~ N(0, I_d)``
  drawn ONCE from the data seed and shared by all prompts of every split (d = 5, h = 10);
- ``combination``: ``f(x) = w^T Phi(x)``, ``Phi(x) = [|x1|, x2^2, x3^3, cos(pi x4), exp(0.2 x5)]``, ``w ~ N(0, I_5)``.

Inputs are ``N(0, I_d)``. Out-of-distribution shifts (App. C.1, studied on linear functions; any shift works with
any class), named as in the result rows:

- ``x_scale=<c>``: the test inputs are multiplied by ``c`` (0.8 or 1.2), the context's and the query's alike
  (App. C.1: ``D_X^train != D_X^test = D_query``), so the queries are the prompt's own next inputs;
- ``query_std=<c>``: the query is drawn with ``c`` times the standard deviation (3), the context is not;
- ``orthant``: one random sign per coordinate and prompt; all prompt inputs lie in that orthant, the query is
  ``N(0, I)``;
- ``w_scale=<c>``: the task weights (``w``; ``a`` for ReLU networks) are multiplied by ``c`` (0.8 or 1.2).

Evaluation layout: prediction ``i`` (0-based) uses the first ``i`` examples as context and query ``xq[:, i]``
with target ``yq[:, i]``. When the query distribution equals the context's (``id``, ``x_scale``, ``w_scale``) the
queries are the prompt's own next inputs, so a causal model scores every prefix in one pass and the batch carries no
``xq``/``yq``; otherwise the batch carries fresh queries ``xq (B, n, d)``, ``yq (B, n)``.

Generation. Each chunk of prompts is a pure function of ``(data_seed, split, shift, index)``. With
``generate_on_device`` (default) a DataLoader item is only a seed and the chunk is drawn in
:meth:`RegressionDataModule.on_after_batch_transfer` on the training device, in whole batches; otherwise the
DataLoader draws it on the CPU. On the CPU both paths give identical tensors (tested); a CUDA generator draws a
different (equally valid) stream, so GPU data is a pure function of the same coordinates but not equal to CPU
data. Training uses :class:`~lit_icl.core.data.EpochSampler`; its item index also gives the training step,
from which the optional curriculum (Garg et al.'s dims/points schedule) is computed, so resume is exact.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lit_icl.core.data import ChunkedDataModule, SeededChunks, collate_chunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.memory import DataPiece
from lit_icl.core.seeding import make_generator
from lit_icl.core.validation import (
    check_int,
    check_literal,
    check_nonempty,
    check_positive,
    check_unique,
)

FunctionClass = Literal["linear", "sparse", "relu", "combination"]
#: App. C.1's dimension per function class (``n_dims: null`` picks it).
DEFAULT_DIMS: dict[str, int] = {"linear": 10, "sparse": 10, "relu": 5, "combination": 5}
#: The four OOD cases of App. C.1 (with both scales where the paper gives two).
PAPER_SHIFTS: tuple[str, ...] = (
    "x_scale=0.8", "x_scale=1.2", "query_std=3", "orthant", "w_scale=0.8", "w_scale=1.2",
)
_SHIFT_RE = re.compile(r"^(x_scale|query_std|w_scale)=([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$")


# ------------------------------------------------------------------------------------------ shifts
@dataclass(frozen=True)
class Shift:
    """A test distribution (App. C.1): input scale (context and query), query std, orthant, task-weight scale."""

    name: str = "id"
    x_scale: float = 1.0
    query_std: float = 1.0
    orthant: bool = False
    w_scale: float = 1.0

    @property
    def separate_queries(self) -> bool:
        """Whether queries follow another distribution than the context (so they are drawn separately).

        ``x_scale`` alone does not separate them: it scales ``D_X^test = D_query`` together (App. C.1).
        """
        return self.query_std != 1.0 or self.orthant


def parse_shift(name: str) -> Shift:
    """``id``, ``orthant``, ``x_scale=<c>``, ``query_std=<c>`` or ``w_scale=<c>`` (``c > 0``) as a :class:`Shift`."""
    if name == "id":
        return Shift()
    if name == "orthant":
        return Shift(name, orthant=True)
    m = _SHIFT_RE.match(str(name))
    if m is None or not 0 < float(m.group(2)) < math.inf:  # 1e400 parses, as inf
        raise ConfigError(
            f"shift {name!r} is not understood; use id, orthant, x_scale=<c>, query_std=<c> or w_scale=<c> "
            f"with a finite c > 0 (App. C.1: {', '.join(PAPER_SHIFTS)})"
        )
    return Shift(name, **{m.group(1): float(m.group(2))})


# ------------------------------------------------------------------------------------------ functions
def combination_features(x: Tensor) -> Tensor:
    """``Phi(x) = [|x1|, x2^2, x3^3, cos(pi x4), exp(0.2 x5)]`` (App. C.1), element-wise over ``(..., 5)``."""
    if x.shape[-1] != 5:
        raise ValueError(f"combination functions are defined on 5 dimensions, got {x.shape[-1]}")
    x1, x2, x3, x4, x5 = x.unbind(-1)
    return torch.stack([x1.abs(), x2**2, x3**3, torch.cos(math.pi * x4), torch.exp(0.2 * x5)], dim=-1)


def relu_first_layer(data_seed: int, n_dims: int, hidden: int) -> Tensor:
    """The shared first layer ``W (d, h)``, columns ``w_i ~ N(0, I_d)``: drawn once per data seed (App. C.1)."""
    g = make_generator("coqe-regression-relu-first-layer", data_seed, n_dims, hidden)
    return torch.randn(n_dims, hidden, generator=g)


def task_features(function_class: str, x: Tensor, first_layer: Tensor | None = None) -> Tensor:
    """The representation every task of the class is linear in: ``Phi(x)``, ``ReLU(x W)``, or ``x`` itself."""
    if function_class == "combination":
        return combination_features(x)
    if function_class == "relu":
        if first_layer is None:
            raise ValueError("relu features need the shared first layer")
        return torch.relu(x @ first_layer.to(x))
    return x


@dataclass(frozen=True)
class Curriculum:
    """Garg et al.'s schedule: ``min(end, start + inc * (step // interval))``."""

    start: int
    end: int
    inc: int
    interval: int

    def value(self, step: int) -> int:
        return min(self.end, self.start + self.inc * (step // self.interval))


def parse_curriculum(name: str, spec: Any) -> Curriculum | None:
    """``null`` or ``[start, end, inc, interval]`` (e.g. Garg's points ``[11, 41, 2, 2000]``)."""
    if spec is None:
        return None
    if isinstance(spec, (str, bytes)) or not hasattr(spec, "__len__") or len(spec) != 4:
        raise ConfigError(f"{name}={spec!r} must be null or [start, end, inc, interval], e.g. [11, 41, 2, 2000]")
    start, end, inc, interval = (check_int(f"{name}[{i}]", v, 0) for i, v in enumerate(spec))
    if start < 1 or start > end or interval < 1:
        raise ConfigError(f"{name}={list(spec)} needs 1 <= start <= end and interval >= 1")
    if inc == 0 and start < end:
        raise ConfigError(f"{name}={list(spec)}: an increment of 0 never grows {start} to {end}; use an increment "
                          f">= 1, or start = end = {end} for a fixed length")
    return Curriculum(start, end, inc, interval)


def sample_prompts(
    function_class: str,
    b: int,
    n: int,
    d: int,
    g: torch.Generator,
    *,
    shift: Shift = Shift(),
    sparsity: int = 3,
    first_layer: Tensor | None = None,
    active_dims: int | None = None,
) -> dict[str, Tensor]:
    """``b`` prompts of ``n`` points on ``g``'s device: ``xs (b, n, d)``, ``ys (b, n)`` [, ``xq``, ``yq``].

    ``active_dims < d`` zeroes the inputs' last coordinates (the dims curriculum); sparse supports are then drawn
    among the active coordinates, as in Garg et al.'s training.
    """
    device = g.device
    a = d if active_dims is None else active_dims
    keep = (torch.arange(d, device=device) < a).float()

    def inputs() -> Tensor:
        return torch.randn(b, n, d, generator=g, device=device) * keep

    xs = inputs()
    first = None
    if function_class in ("linear", "sparse", "combination"):
        w = torch.randn(b, d, generator=g, device=device)
        if function_class == "sparse":
            order = torch.rand(b, a, generator=g, device=device).argsort(-1)[:, :sparsity]
            mask = torch.zeros(b, d, device=device).scatter_(1, order, 1.0)
            w = w * mask
    elif function_class == "relu":
        if first_layer is None:
            raise ValueError("relu prompts need the shared first layer (relu_first_layer)")
        first = first_layer.to(device)
        h = first.shape[1]
        w = torch.randn(b, h, generator=g, device=device) * math.sqrt(2.0 / h)
    else:
        raise ValueError(f"unknown function class {function_class!r}")
    w = w * shift.w_scale

    def f(x: Tensor) -> Tensor:
        return torch.einsum("bnk,bk->bn", task_features(function_class, x, first), w)

    if shift.orthant:
        signs = torch.where(torch.rand(b, 1, d, generator=g, device=device) < 0.5, -1.0, 1.0)
        xs = xs.abs() * signs
    xs = xs * shift.x_scale
    out = {"xs": xs, "ys": f(xs)}
    if shift.separate_queries:
        # D_query: N(0, I) times query_std, and times x_scale, which scales D_X^test = D_query together.
        xq = inputs() * (shift.query_std * shift.x_scale)
        out.update(xq=xq, yq=f(xq))
    return out


# ------------------------------------------------------------------------------------------ datasets
def parse_shifts(shifts: list[str] | None) -> tuple[Shift, ...]:
    """The test distributions named by ``shifts`` (``null`` = ``[id]``): a non-empty list without repeats."""
    names = check_unique("shifts", check_nonempty("shifts", ["id"] if shifts is None else shifts, "[id, orthant]"))
    return tuple(parse_shift(s) for s in names)


@dataclass(frozen=True)
class PromptSpec:
    """Everything that determines a chunk besides its seed (picklable; what a DataLoader worker needs).

    Built from the data module's arguments, each single value already checked where it was parsed; the spec
    checks how they fit together, one ConfigError each.
    """

    function_class: str
    n_dims: int
    n_points: int
    chunk_size: int
    sparsity: int
    hidden: int
    shifts: tuple[Shift, ...]
    dims_curriculum: Curriculum | None
    points_curriculum: Curriculum | None
    data_seed: int
    generate_on_device: bool

    def __post_init__(self) -> None:
        if self.function_class == "combination" and self.n_dims != 5:
            raise ConfigError(f"combination functions are defined on 5 dimensions; set n_dims: 5 (got {self.n_dims})")
        check_int("n_points", self.n_points, 2, hint="a prompt needs at least one example and one query")
        if self.function_class == "sparse":
            check_positive("sparsity", self.sparsity, True)
            if self.sparsity > self.n_dims:
                raise ConfigError(f"sparsity={self.sparsity} exceeds n_dims={self.n_dims}; choose s <= d")
        if self.function_class == "relu":
            check_positive("hidden", self.hidden, True)
        if self.shifts[0].name != "id":
            names = [s.name for s in self.shifts]
            raise ConfigError(f"shifts={names} must start with id (dataloader 0 is the in-distribution test)")
        dims, points = self.dims_curriculum, self.points_curriculum
        if dims is not None and dims.end != self.n_dims:
            raise ConfigError(f"curriculum_dims ends at {dims.end}; its end must equal n_dims={self.n_dims}")
        if points is not None:
            if points.end != self.n_points:
                raise ConfigError(f"curriculum_points ends at {points.end}; its end must equal n_points={self.n_points}")
            if points.start < 2:
                raise ConfigError("curriculum_points must start at >= 2 points")

    @cached_property
    def first_layer(self) -> Tensor | None:
        """The ReLU class's first layer, shared by all prompts of every split (None for the other classes)."""
        return relu_first_layer(self.data_seed, self.n_dims, self.hidden) if self.function_class == "relu" else None

    def curriculum_at(self, step: int) -> tuple[int, int]:
        """(points, active dims) of training step ``step``."""
        n = self.points_curriculum.value(step) if self.points_curriculum else self.n_points
        a = self.dims_curriculum.value(step) if self.dims_curriculum else self.n_dims
        return n, a

    @staticmethod
    def read_meta(meta: dict[str, Tensor]) -> tuple[list[int], int, int, int]:
        """``(seeds, shift index, points, active dims)`` of a batch of chunk seeds, as Python numbers."""
        return (meta["seed"].tolist(), int(meta["shift_index"][0]), int(meta["n_points"][0]),
                int(meta["active_dims"][0]))

    def generate(self, meta: dict[str, Any], device: torch.device) -> dict[str, Tensor]:
        """The prompts of the chunks whose seeds are in ``meta`` (one chunk per seed), drawn on ``device``.

        ``meta["host"]``, where present, holds :meth:`read_meta` of the batch read before it moved to ``device``.
        """
        seeds, shift_index, n, a = meta["host"] if "host" in meta else self.read_meta(meta)
        shift = self.shifts[shift_index]
        chunks = []
        for seed in seeds:
            g = torch.Generator(device=device).manual_seed(int(seed))
            chunks.append(sample_prompts(
                self.function_class, self.chunk_size, n, self.n_dims, g, shift=shift, sparsity=self.sparsity,
                first_layer=self.first_layer, active_dims=a,
            ))
        return collate_chunks(chunks)


class PromptChunks(SeededChunks):
    """Item ``i``: a chunk of prompts seeded by ``(data_seed, "coqe-regression", split, shift, i)``, as a seed or
    as tensors.

    ``items_per_step`` converts a training item index to its optimisation step (for the curriculum): one
    step consumes ``chunks_per_batch * world_size`` consecutive global indices of the
    :class:`~lit_icl.core.data.EpochSampler`.
    """

    def __init__(self, spec: PromptSpec, split: str, shift_index: int, length: int, items_per_step: int = 1):
        super().__init__(length, spec.data_seed, stream=("coqe-regression", split, spec.shifts[shift_index].name))
        self.spec, self.split, self.shift_index = spec, split, shift_index
        self.items_per_step = items_per_step

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        spec = self.spec
        if self.split == "train":
            n, a = spec.curriculum_at(index // self.items_per_step)
        else:
            n, a = spec.n_points, spec.n_dims
        meta = {
            "seed": torch.tensor([self.seed(index)]), "n_points": torch.tensor([n]), "active_dims": torch.tensor([a]),
            "shift_index": torch.tensor([self.shift_index]),
        }
        return meta if spec.generate_on_device else spec.generate(meta, torch.device("cpu"))


class RegressionDataModule(ChunkedDataModule):
    """Prompts of one function class for training (ID), validation (ID) and test (ID and OOD shifts).

    Args:
        function_class: ``linear``, ``sparse``, ``relu`` or ``combination`` (App. C.1).
        n_dims: input dimension d; ``null`` = the paper's (10, 10, 5, 5); combination needs 5.
        n_points: points per prompt (the last prediction uses ``n_points - 1`` examples); the x-axis of Fig. 3
            runs over 0 .. n_points - 1 in-context examples.
        sparsity: non-zero weights s of ``sparse`` (3).
        hidden: hidden units h of ``relu`` (10).
        shifts: test distributions, one test dataloader each, in this order; ``id`` must be first.
        curriculum_dims: ``null`` or ``[start, end, inc, interval]`` over active input coordinates (Garg:
            ``[5, 20, 1, 2000]``); ``end`` must equal ``n_dims``.
        curriculum_points: ``null`` or ``[start, end, inc, interval]`` over training prompt length (Garg linear:
            ``[11, 41, 2, 2000]``); ``end`` must equal ``n_points``.
        batch_size: training prompts per step (64, App. C.1; per device under DDP).
        chunk_size: prompts per dataset item; divides batch sizes and evaluation set sizes.
        train_batches_per_epoch: steps per epoch (checkpoint and validation at each epoch end).
        val_prompts: ID validation prompts (fixed).
        test_prompts: prompts per test distribution (fixed; Garg et al. use 1280).
        eval_batch_size: prompts per validation/test step.
        data_seed: seed of all prompts and of the ReLU class's shared first layer.
        generate_on_device: draw prompts on the training device after transfer (the loader moves seeds only).
        num_workers: DataLoader workers (generation is vectorised; 0 is enough).
    """

    #: Only ``test`` reads the shifts and their set size, so a resumed fit may change them (``args_free_on_resume``);
    #: not ``generate_on_device``: on a GPU it draws other prompts.
    free_on_resume = ("shifts", "test_prompts")

    def __init__(
        self,
        function_class: FunctionClass = "linear",
        n_dims: int | None = None,
        n_points: int = 41,
        sparsity: int = 3,
        hidden: int = 10,
        shifts: list[str] | None = None,
        curriculum_dims: list[int] | None = None,
        curriculum_points: list[int] | None = None,
        batch_size: int = 64,
        chunk_size: int = 64,
        train_batches_per_epoch: int = 1000,
        val_prompts: int = 640,
        test_prompts: int = 1280,
        eval_batch_size: int = 640,
        data_seed: int = 0,
        generate_on_device: bool = True,
        num_workers: int = 0,
    ):
        super().__init__()
        save_init_hparams(self)
        self.spec = PromptSpec(  # the arguments in order, each checked as it is parsed, then together
            check_literal("function_class", function_class, FunctionClass),
            DEFAULT_DIMS[function_class] if n_dims is None else check_positive("n_dims", n_dims, True),
            n_points, chunk_size, sparsity, hidden, parse_shifts(shifts),
            parse_curriculum("curriculum_dims", curriculum_dims), parse_curriculum("curriculum_points", curriculum_points),
            data_seed, generate_on_device,
        )
        self.check_loader_args("val_prompts", "test_prompts")
        self._check_memory()
        #: What the nets, the module and the RepresentationMetrics callback read: the function class, the input
        #: dimension, the points per evaluation prompt and the ReLU class's shared first layer (None otherwise).
        self.function_class, self.n_dims, self.n_points = self.spec.function_class, self.spec.n_dims, n_points
        self.first_layer = self.spec.first_layer

    def _check_memory(self) -> None:
        """Refuse sizes (``n_dims``, ``n_points``, ``hidden``, prompt counts) whose data would not fit in memory: a
        batch of each split (the curriculum's longest prompts are ``n_points`` long), and the ReLU class's shared
        first layer, which is built here."""
        spec = self.spec
        # xs and ys: n_points points of n_dims + 1 float32 values (the task weights not counted)
        prompt = (4 * spec.n_points * (spec.n_dims + 1), f"{spec.n_points} points x {spec.n_dims + 1} values")
        held = []
        if spec.function_class == "relu":
            held.append(DataPiece("the ReLU class's first layer", 4 * spec.n_dims * spec.hidden,
                                  f"n_dims={spec.n_dims} x hidden={spec.hidden} values"))
        self.check_batches_fit("prompts", {"training": prompt, "validation": prompt, "test": prompt}, *held)

    # -------------------------------------------------------------- generation
    @property
    def shift_names(self) -> list[str]:
        return [s.name for s in self.spec.shifts]

    def curriculum_at(self, step: int) -> tuple[int, int]:
        """(points, active dims) of training step ``step``."""
        return self.spec.curriculum_at(step)

    def features(self, x: Tensor) -> Tensor:
        """``Phi(x)`` / ``ReLU(x W)`` / ``x``: what every task of the class is linear in (for the Fig. 6 probe)."""
        return task_features(self.function_class, x, self.first_layer)

    def on_before_batch_transfer(self, batch: dict[str, Any], dataloader_idx: int) -> dict[str, Any]:
        if "seed" in batch:  # read on the host: after the transfer each read would wait for the device
            batch["host"] = self.spec.read_meta(batch)
        return batch

    def on_after_batch_transfer(self, batch: dict[str, Any], dataloader_idx: int) -> dict[str, Tensor]:
        if "seed" in batch:
            return self.spec.generate(batch, batch["seed"].device)
        return batch

    # -------------------------------------------------------------- loaders
    def train_dataloader(self) -> DataLoader:
        # A training item's index gives its step (for the curriculum): an epoch's items over its steps.
        steps = self.hparams.train_batches_per_epoch
        return self.train_loader(lambda items: PromptChunks(self.spec, "train", 0, items, items // steps))

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader(PromptChunks(self.spec, "val", 0, self.set_items("val_prompts")))

    def test_dataloader(self) -> list[DataLoader]:
        """One loader per shift, in the order of ``shifts`` (dataloader_idx 0 = ``id``)."""
        items = self.set_items("test_prompts")
        return [self.eval_loader(PromptChunks(self.spec, "test", i, items)) for i in range(len(self.spec.shifts))]

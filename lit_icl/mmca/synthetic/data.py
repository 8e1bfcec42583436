"""Multi-modal ICL prompts from the latent-factor model of Sec. 3 (Eqs. 3.1-3.3), generated on the fly.

A prompt ``j`` draws ``m = [v; r] in R^{d1 + d2}`` (a uniformly random direction times a norm uniform on
``norm_range``, App. H) and ``zeta ~ N(0, 1)``; each token ``i`` of the context and the query then draws a
latent ``u_i ~ N(0, 1)`` shared by both modalities and the response (Eq. 3.1)::

    zbar_i = u_i v + xi_i,   ztilde_i = u_i r + eta_i,   y_i = zeta u_i,   x_i = [zbar_i; ztilde_i].

So ``(x_i, y_i) | (m, zeta) ~ N(0, [[I + m m^T, zeta m], [zeta m^T, zeta^2]])`` (Eq. 3.2) and the Bayes predictor
is ``<w, x_q>`` with ``w = zeta m / (1 + ||m||^2)`` (Eq. 3.3).

Layouts are token-major: ``x (B, L, d)``, ``y (B, L)``, ``x_query (B, d)``, ``y_query (B,)``; batches also carry
the prompt's latent ``m (B, d)`` and ``zeta (B,)`` so the Bayes predictor and the ICL error can be computed.

One dataset *item* is a chunk of ``chunk_size`` prompts generated in one vectorised call from a generator seeded
by ``(data_seed, split, index)``:

- ``train_prompts = N`` (App. H, N = 2000): the training set is the fixed item set of split ``train_fixed``;
  the training sampler walks it cyclically (``index mod N / chunk_size``), so with ``batch_size = N`` every step
  is one full-batch gradient step on the empirical loss ``l_{N, L_tr}``. The set is the same at every step, so it
  moves to the training device once: the loader hands over which chunks a batch holds, and
  :meth:`LatentFactorDataModule.on_after_batch_transfer` gathers them there (at App. H's size a batch is 27 MB,
  which would otherwise cross from the host at every step);
- ``train_prompts = None``: fresh prompts every step (split ``train``, index from :class:`EpochSampler`). With
  ``generate_on_device`` (default) a loader item is only its chunk's seed and the chunk is drawn in
  :meth:`LatentFactorDataModule.on_after_batch_transfer` on the training device. On the CPU that gives the very
  tensors the loader would draw (tested); a CUDA generator draws a different, equally valid stream, so GPU data is
  a pure function of the same coordinates but not equal to CPU data;
- validation and test sets are fixed. Test prompts have the largest test context length; shorter test contexts
  are prefixes of the same prompts, so errors at different ``L_te`` are compared on the same tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_icl.core.data import ChunkedDataModule, DeviceBank, SeededChunks, collate_chunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.memory import DataPiece
from lit_icl.core.validation import check_nonempty, check_positive, check_unique
from lit_icl.mmca.theory import alpha_star, check_norm_range

Split = Literal["train", "train_fixed", "val", "test"]


def sample_latent_factor_prompts(
    n_prompts: int,
    context_length: int,
    d1: int,
    d2: int,
    norm_range: Sequence[float],
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """``n_prompts`` prompts of Eq. (3.1), float32, in one vectorised call on ``generator``'s device.

    Returns a dict with ``x (n, L, d)``, ``y (n, L)``, ``x_query (n, d)``, ``y_query (n,)``, ``m (n, d)`` and
    ``zeta (n,)``, ``d = d1 + d2``. The first ``d1`` coordinates of ``x`` are the first modality ``zbar``.
    """
    lo, hi = norm_range
    d = d1 + d2
    n, L, g, device = n_prompts, context_length, generator, generator.device
    direction = torch.randn(n, d, generator=g, device=device)
    direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    norm = lo + (hi - lo) * torch.rand(n, 1, generator=g, device=device)
    m = norm * direction  # m = [v; r]: spherical direction, norm uniform on [lo, hi] (App. H)
    zeta = torch.randn(n, generator=g, device=device)
    # Context and query tokens together: u (latent), mu = [xi; eta] (modality noise), Eq. (3.1).
    u = torch.randn(n, L + 1, generator=g, device=device)
    mu = torch.randn(n, L + 1, d, generator=g, device=device)
    x_all = u.unsqueeze(-1) * m.unsqueeze(1) + mu
    y_all = zeta.unsqueeze(-1) * u
    return {
        "x": x_all[:, :L].contiguous(),
        "y": y_all[:, :L].contiguous(),
        "x_query": x_all[:, L].contiguous(),
        "y_query": y_all[:, L].contiguous(),
        "m": m,
        "zeta": zeta,
    }


class LatentFactorPrompts(SeededChunks):
    """Chunks of latent-factor prompts; item ``i`` is seeded by ``(data_seed, split, i mod cycle)``.

    ``cycle`` (the number of chunks of a fixed training set) makes the training sampler's ever-growing indices
    walk the same fixed prompts (:meth:`keys`). With ``seeds_only`` an item is ``{"seed": (1,) int64}``, the seed
    its chunk is drawn from by :meth:`draw` on the training device.
    """

    def __init__(
        self,
        split: Split,
        length: int,
        chunk_size: int,
        context_length: int,
        d1: int,
        d2: int,
        norm_range: tuple[float, float],
        data_seed: int,
        cycle: int | None = None,
        seeds_only: bool = False,
    ):
        super().__init__(length, data_seed, (split,))
        self.split = split
        self.chunk_size = chunk_size
        self.context_length = context_length
        self.d1, self.d2 = d1, d2
        self.norm_range = norm_range
        self.cycle = cycle
        self.seeds_only = seeds_only

    def keys(self, index: int) -> tuple[object, ...]:
        """``(split, index)``, or ``(split, index mod cycle)`` for a fixed training set."""
        return (self.split, index % self.cycle if self.cycle is not None else index)

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        if self.seeds_only:
            return {"seed": torch.tensor([self.seed(index)])}
        return sample_latent_factor_prompts(
            self.chunk_size, self.context_length, self.d1, self.d2, self.norm_range, self.generator(index)
        )

    def draw(self, seeds: Sequence[int], device: torch.device) -> dict[str, Tensor]:
        """The chunks of ``seeds`` (from :meth:`seed`) drawn on ``device`` and stacked into one batch; on the CPU
        equal to the items :meth:`make_chunk` makes for those seeds."""
        return collate_chunks([
            sample_latent_factor_prompts(self.chunk_size, self.context_length, self.d1, self.d2, self.norm_range,
                                         torch.Generator(device=device).manual_seed(int(seed)))
            for seed in seeds
        ])


class FixedChunkKeys(Dataset):
    """Which chunk of a fixed training set of ``cycle`` chunks each training item holds: ``index mod cycle``.

    The items of :class:`LatentFactorPrompts` ``("train_fixed", ..., cycle)`` as keys, ``{"chunk": (1,) int64}``;
    the DataLoader stacks a batch's keys and the data module gathers the chunks on the device
    (:class:`~lit_icl.core.data.DeviceBank`).
    """

    def __init__(self, length: int, cycle: int):
        self.length, self.cycle = length, cycle

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"chunk": torch.tensor([int(index) % self.cycle])}


class LatentFactorDataModule(ChunkedDataModule):
    """Prompts of the multi-modal latent-factor model (Sec. 3, App. H) for training and the ``L_te`` sweep.

    Args:
        d1: dimension of the first modality ``zbar`` (16 in App. H).
        d2: dimension of the second modality ``ztilde`` (16 in App. H).
        norm_range: ``(lo, hi)``: ``||m||`` is uniform on it (App. H: ``[0, 5]``; Fig. 4: ``[0, 2]``).
        train_context_length: ``L_tr`` (100 in App. H).
        train_prompts: ``N``, the size of the fixed training set (2000 in App. H), or ``None`` for fresh
            prompts every step.
        batch_size: prompts per training step (per device); ``batch_size = train_prompts`` is full-batch
            gradient descent on ``l_{N, L_tr}`` as in App. H.
        chunk_size: prompts generated per dataset item; must divide every batch and set size.
        train_batches_per_epoch: training steps per epoch (a checkpoint is written at every epoch end).
        val_prompts: size of the fixed validation set (context length ``L_tr``).
        test_prompts: size of the fixed test set (1000 in Figs. 5-6).
        test_context_lengths: the ``L_te`` sweep; test prompts have the largest, the others are prefixes.
        eval_batch_size: prompts per validation/test step.
        data_seed: seed of all generated data, independent of ``seed_everything``.
        num_workers: DataLoader workers (generation is one vectorised call, so 0 is usually right).
        generate_on_device: with ``train_prompts = None``, draw each step's fresh prompts on the training device
            after the transfer (the loader moves seeds only); on a CPU the same prompts either way.
    """

    #: Only ``test`` reads these, so a resumed fit may change them (``args_free_on_resume``).
    free_on_resume = ("test_prompts", "test_context_lengths")

    def __init__(
        self,
        d1: int = 16,
        d2: int = 16,
        norm_range: Sequence[float] = (0.0, 5.0),
        train_context_length: int = 100,
        train_prompts: int | None = 2000,
        batch_size: int = 2000,
        chunk_size: int = 250,
        train_batches_per_epoch: int = 50,
        val_prompts: int = 500,
        test_prompts: int = 1000,
        test_context_lengths: Sequence[int] = (10, 25, 50, 100, 200, 400, 800),
        eval_batch_size: int = 250,
        data_seed: int = 0,
        num_workers: int = 0,
        generate_on_device: bool = True,
    ):
        super().__init__()
        save_init_hparams(self)
        self.norm_range, lengths = self._validate()
        self.d1, self.d2, self.d = d1, d2, d1 + d2
        self.train_context_length, self.train_prompts = train_context_length, train_prompts
        self.test_context_lengths = sorted(lengths)
        self.test_prompts = test_prompts
        self.data_seed = data_seed
        check_prompts_fit(self)

    def _validate(self) -> tuple[tuple[float, float], list[int]]:
        """Check every argument; returns the normalised ``norm_range`` and ``test_context_lengths``."""
        hp = self.hparams
        for name in ("d1", "d2"):
            check_positive(name, hp[name], integer=True, hint="16 in App. H")
        norm_range = check_norm_range(hp.norm_range)
        check_positive("train_context_length", hp.train_context_length, integer=True, hint="100 in App. H")
        self.check_loader_args("val_prompts", "test_prompts", *["train_prompts"] * (hp.train_prompts is not None))
        if hp.train_prompts is not None and hp.train_prompts % hp.batch_size:
            raise ConfigError(
                f"batch_size={hp.batch_size} must divide train_prompts={hp.train_prompts} so every epoch sees "
                f"whole passes; use batch_size={hp.train_prompts} for full-batch gradient descent (App. H)"
            )
        lengths = check_nonempty("test_context_lengths", hp.test_context_lengths, example="[10, 100, 800]")
        for value in lengths:
            check_positive("test_context_lengths entry", value, integer=True, hint="e.g. [10, 100, 800]")
        check_unique("test_context_lengths", lengths)
        return norm_range, lengths

    @property
    def alpha_star(self) -> float:
        """``alpha*`` of Theorem 6.2 for this data's ``||m||`` distribution."""
        return alpha_star(self.norm_range)

    def _dataset(self, split: Split, length: int, context_length: int, cycle: int | None = None,
                 seeds_only: bool = False) -> LatentFactorPrompts:
        return LatentFactorPrompts(split, length, self.hparams.chunk_size, context_length, self.d1, self.d2,
                                   self.norm_range, self.data_seed, cycle, seeds_only)

    def train_dataloader(self) -> DataLoader:
        if self.train_prompts is None:
            on_device = bool(self.hparams.generate_on_device)
            return self.train_loader(lambda items: self._dataset("train", items, self.train_context_length,
                                                                 seeds_only=on_device))
        cycle = self.set_items("train_prompts")  # the fixed training set, walked again every epoch
        return self.train_loader(lambda items: FixedChunkKeys(items, cycle))

    @cached_property
    def fixed_training_set(self) -> DeviceBank:
        """The ``train_fixed`` chunks of :class:`LatentFactorPrompts`, stacked as ``{key: (chunks, chunk_size,
        ...)}`` once and moved to the training device once."""
        cycle = self.set_items("train_prompts")
        return DeviceBank.stacked(self._dataset("train_fixed", cycle, self.train_context_length, cycle))

    def on_before_batch_transfer(self, batch: dict[str, Any], dataloader_idx: int) -> dict[str, Any]:
        if "seed" in batch:  # read on the host: after the transfer the read would wait for the device
            batch["host_seeds"] = batch["seed"].tolist()
        return batch

    def on_after_batch_transfer(self, batch: dict[str, Any], dataloader_idx: int) -> dict[str, Tensor]:
        """A training batch arrives as the chunk keys of the fixed set or the seeds of fresh chunks (see the
        module docstring): gather or draw its prompts on the device."""
        if "chunk" in batch:
            return {k: v.flatten(0, 1) for k, v in self.fixed_training_set.gather(batch["chunk"]).items()}
        if "seed" in batch:
            seeds = batch["host_seeds"] if "host_seeds" in batch else batch["seed"].tolist()
            return self._dataset("train", 0, self.train_context_length).draw(seeds, batch["seed"].device)
        return batch

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader(self._dataset("val", self.set_items("val_prompts"), self.train_context_length))

    def test_dataloader(self) -> DataLoader:
        lengths = max(self.test_context_lengths)
        return self.eval_loader(self._dataset("test", self.set_items("test_prompts"), lengths))


def check_prompts_fit(data: LatentFactorDataModule) -> None:
    """Refuse sizes of ``data`` (``d1``, ``d2``, context lengths, prompt counts) whose prompts would not fit in
    memory: a batch of each split, and the fixed training set, which is held whole."""
    def prompt(length: int) -> tuple[int, str]:
        # x and y of the context and the query: (L + 1) tokens of d + 1 float32 values (m and zeta not counted)
        return 4 * (length + 1) * (data.d + 1), f"{length + 1} tokens x {data.d + 1} values"

    held = []
    if data.train_prompts is not None:
        nbytes, holds = prompt(data.train_context_length)
        held.append(DataPiece("the fixed training set", data.train_prompts * nbytes,
                              f"train_prompts={data.train_prompts} prompts of {holds}"))
    data.check_batches_fit("prompts", {"training": prompt(data.train_context_length),
                                       "validation": prompt(data.train_context_length),
                                       "test": prompt(max(data.test_context_lengths))}, *held)

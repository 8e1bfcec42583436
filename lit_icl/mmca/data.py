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
  is one full-batch gradient step on the empirical loss ``l_{N, L_tr}``;
- ``train_prompts = None``: fresh prompts every step (split ``train``, index from :class:`EpochSampler`);
- validation and test sets are fixed. Test prompts have the largest test context length; shorter test contexts
  are prefixes of the same prompts, so errors at different ``L_te`` are compared on the same tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_icl.core.data import EpochSampler, collate_chunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator

Split = Literal["train", "train_fixed", "val", "test"]


def alpha_star(norm_range: Sequence[float]) -> float:
    """``alpha* = 2 / (2 + m_lo + m_hi)`` of Theorem 6.2, where ``m_lo, m_hi`` bound ``||m||^2``.

    ``norm_range`` bounds ``||m||`` (App. H draws it uniformly on ``[0, 5]``), so ``m_lo = lo^2``, ``m_hi = hi^2``:
    ``[0, 5]`` gives ``2 / 27 ~ 0.074``. (App. H quotes ``1/26 ~ 0.04`` for this distribution, which matches none of
    the paper's formulas; we follow Theorem 6.2.)
    """
    lo, hi = float(norm_range[0]), float(norm_range[1])
    return 2.0 / (2.0 + lo * lo + hi * hi)


def check_norm_range(norm_range: Sequence[float]) -> tuple[float, float]:
    """Validate ``(lo, hi)`` with ``0 <= lo < hi`` (Assumption 6.1 needs a non-degenerate, bounded ``||m||``)."""
    try:
        lo, hi = (float(v) for v in norm_range)
    except (TypeError, ValueError):
        raise ConfigError(f"norm_range={norm_range!r} must be two numbers (lo, hi), e.g. [0, 5]") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 <= lo < hi):
        raise ConfigError(
            f"norm_range=({lo:g}, {hi:g}) must satisfy 0 <= lo < hi < inf (Assumption 6.1), e.g. [0, 5]"
        )
    return lo, hi


def sample_latent_factor_prompts(
    n_prompts: int,
    context_length: int,
    d1: int,
    d2: int,
    norm_range: Sequence[float],
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """``n_prompts`` prompts of Eq. (3.1), float32, in one vectorised call on the CPU generator.

    Returns a dict with ``x (n, L, d)``, ``y (n, L)``, ``x_query (n, d)``, ``y_query (n,)``, ``m (n, d)`` and
    ``zeta (n,)``, ``d = d1 + d2``. The first ``d1`` coordinates of ``x`` are the first modality ``zbar``.
    """
    lo, hi = norm_range
    d = d1 + d2
    n, L, g = n_prompts, context_length, generator
    direction = torch.randn(n, d, generator=g)
    direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    norm = lo + (hi - lo) * torch.rand(n, 1, generator=g)
    m = norm * direction  # m = [v; r]: spherical direction, norm uniform on [lo, hi] (App. H)
    zeta = torch.randn(n, generator=g)
    # Context and query tokens together: u (latent), mu = [xi; eta] (modality noise), Eq. (3.1).
    u = torch.randn(n, L + 1, generator=g)
    mu = torch.randn(n, L + 1, d, generator=g)
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


def bayes_weights(m: Tensor, zeta: Tensor) -> Tensor:
    """``w = zeta m / (1 + ||m||^2)`` of Eq. (3.3), per prompt: ``(B, d)``."""
    return zeta.unsqueeze(-1) * m / (1.0 + (m * m).sum(-1, keepdim=True))


class LatentFactorPrompts(Dataset):
    """Chunks of latent-factor prompts; item ``i`` is seeded by ``(data_seed, split, i mod cycle)``.

    ``cycle`` (the number of chunks of a fixed training set) makes the training sampler's ever-growing indices
    walk the same fixed prompts; chunks are cached, which changes nothing but the time (they are a pure function
    of their seed).
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
    ):
        self.split = split
        self.length = length
        self.chunk_size = chunk_size
        self.context_length = context_length
        self.d1, self.d2 = d1, d2
        self.norm_range = norm_range
        self.data_seed = data_seed
        self.cycle = cycle
        self._cache: dict[int, dict[str, Tensor]] = {}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        key = int(index) % self.cycle if self.cycle is not None else int(index)
        if self.cycle is not None and key in self._cache:
            return self._cache[key]
        g = make_generator(self.data_seed, self.split, key)
        item = sample_latent_factor_prompts(
            self.chunk_size, self.context_length, self.d1, self.d2, self.norm_range, g
        )
        if self.cycle is not None:
            self._cache[key] = item
        return item


class LatentFactorDataModule(LightningDataModule):
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
    """

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
    ):
        super().__init__()
        self.save_hyperparameters()
        for name, value in (("d1", d1), ("d2", d2)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer (16 in App. H)")
        self.norm_range = check_norm_range(norm_range)
        if not isinstance(train_context_length, int) or train_context_length < 1:
            raise ConfigError(
                f"train_context_length={train_context_length!r} must be a positive integer (100 in App. H)"
            )
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ConfigError(f"chunk_size={chunk_size!r} must be a positive integer")
        sizes = [
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
            ("val_prompts", val_prompts),
            ("test_prompts", test_prompts),
        ]
        if train_prompts is not None:
            sizes.append(("train_prompts", train_prompts))
        for name, value in sizes:
            if not isinstance(value, int) or value < 1 or value % chunk_size:
                raise ConfigError(
                    f"{name}={value!r} must be a positive multiple of chunk_size={chunk_size}; change one of them"
                )
        if train_prompts is not None and train_prompts % batch_size:
            raise ConfigError(
                f"batch_size={batch_size} must divide train_prompts={train_prompts} so every epoch sees whole "
                f"passes; use batch_size={train_prompts} for full-batch gradient descent (App. H)"
            )
        if not isinstance(train_batches_per_epoch, int) or train_batches_per_epoch < 1:
            raise ConfigError(
                f"train_batches_per_epoch={train_batches_per_epoch!r} must be a positive integer"
            )
        lengths = list(test_context_lengths)
        if not lengths or any(not isinstance(v, int) or v < 1 for v in lengths):
            raise ConfigError(
                f"test_context_lengths={lengths!r} must be a non-empty list of positive integers, e.g. [10, 100, 800]"
            )
        if len(set(lengths)) != len(lengths):
            raise ConfigError(f"test_context_lengths={lengths!r} has duplicates; list each L_te once")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r} must be a non-negative integer")

        self.d1, self.d2 = d1, d2
        self.d = d1 + d2
        self.train_context_length = train_context_length
        self.train_prompts = train_prompts
        self.test_context_lengths = sorted(lengths)
        self.test_prompts = test_prompts
        self.data_seed = data_seed

    @property
    def alpha_star(self) -> float:
        """``alpha*`` of Theorem 6.2 for this data's ``||m||`` distribution."""
        return alpha_star(self.norm_range)

    def _dataset(
        self, split: Split, length: int, context_length: int, cycle: int | None = None
    ) -> LatentFactorPrompts:
        hp = self.hparams
        return LatentFactorPrompts(
            split,
            length,
            hp.chunk_size,
            context_length,
            self.d1,
            self.d2,
            self.norm_range,
            self.data_seed,
            cycle,
        )

    def _loader(self, dataset: Dataset, batch_size: int, sampler: EpochSampler | None = None) -> DataLoader:
        hp = self.hparams
        return DataLoader(
            dataset,
            batch_size=batch_size // hp.chunk_size,
            sampler=sampler,
            shuffle=False,
            collate_fn=collate_chunks,
            num_workers=hp.num_workers,
            persistent_workers=False,
        )

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        world, rank = (
            (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        )
        items = hp.train_batches_per_epoch * (hp.batch_size // hp.chunk_size) * world
        if self.train_prompts is None:
            ds = self._dataset("train", items, self.train_context_length)
        else:
            ds = self._dataset(
                "train_fixed", items, self.train_context_length, self.train_prompts // hp.chunk_size
            )
        return self._loader(ds, hp.batch_size, EpochSampler(items, world, rank))

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        ds = self._dataset("val", hp.val_prompts // hp.chunk_size, self.train_context_length)
        return self._loader(ds, hp.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        hp = self.hparams
        ds = self._dataset("test", hp.test_prompts // hp.chunk_size, max(self.test_context_lengths))
        return self._loader(ds, hp.eval_batch_size)

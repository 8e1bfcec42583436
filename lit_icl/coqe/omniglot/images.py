"""Omniglot-layout image folders and their cached image bank.

torchvision's layout, which the real data and the ``glyphs`` stand-in share::

    <folder>/images_background/<alphabet>/<character>/<id>_<drawer>.png
    <folder>/images_evaluation/<alphabet>/<character>/<id>_<drawer>.png

:func:`index_folder` lists it (one-line errors that say what to fix), :func:`load_bank` reads every image once
into a uint8 tensor cached beside the folder, :func:`save_bank` writes that cache atomically.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lit_icl.core.errors import ConfigError

SPLIT_FOLDERS = ("images_background", "images_evaluation")
OMNIGLOT_HELP = (
    "put torchvision's Omniglot folder (omniglot-py, with images_background/ and images_evaluation/) in "
    "data.init_args.root (data/ by default), or set data.init_args.source: glyphs to run on the offline stand-in"
)


# ------------------------------------------------------------------------------------------ folders
@dataclass(frozen=True)
class FolderIndex:
    """The PNG files of an Omniglot-layout folder: ``files[c][k]`` is exemplar ``k`` of class ``c``.

    Classes are ordered by (split folder, alphabet, character) names, sorted (torchvision lists them with
    ``os.listdir``, whose order depends on the file system); exemplars by file name.
    """

    root: Path
    class_names: list[str]
    files: list[list[Path]]

    @property
    def n_classes(self) -> int:
        return len(self.files)

    @property
    def n_exemplars(self) -> int:
        return len(self.files[0])

    def fingerprint(self) -> tuple[int, int]:
        """(number of files, total bytes): changes when the folder's content does."""
        paths = [p for cls in self.files for p in cls]
        return len(paths), sum(p.stat().st_size for p in paths)


def index_folder(root: str | os.PathLike[str]) -> FolderIndex:
    """List an Omniglot-layout folder; raise :class:`ConfigError` (one line) when it is missing or malformed."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"image folder {root} does not exist; {OMNIGLOT_HELP}")
    present = [s for s in SPLIT_FOLDERS if (root / s).is_dir()]
    if not present:
        raise ConfigError(f"{root} has neither images_background/ nor images_evaluation/; {OMNIGLOT_HELP}")
    names: list[str] = []
    files: list[list[Path]] = []
    for split in present:
        for alphabet in sorted(p for p in (root / split).iterdir() if p.is_dir()):
            for char in sorted(p for p in alphabet.iterdir() if p.is_dir()):
                pngs = sorted(p for p in char.iterdir() if p.suffix.lower() == ".png")
                if not pngs:
                    raise ConfigError(f"character folder {char} has no .png files; {OMNIGLOT_HELP}")
                names.append(f"{split}/{alphabet.name}/{char.name}")
                files.append(pngs)
    if not files:
        raise ConfigError(f"{root} holds no alphabet/character/*.png folders; {OMNIGLOT_HELP}")
    counts = {len(f) for f in files}
    if len(counts) > 1:
        bad = next(n for n, f in zip(names, files) if len(f) != len(files[0]))
        raise ConfigError(
            f"characters in {root} have different numbers of drawings ({sorted(counts)}, e.g. {bad}); "
            "every character needs the same number (20 in Omniglot)"
        )
    return FolderIndex(root, names, files)


def _png_to_tensor(path: Path, size: int) -> Tensor:
    """One image as uint8 ``(size, size)``; an unreadable file is one ConfigError naming it."""
    from PIL import Image, UnidentifiedImageError  # Pillow comes with torchvision

    try:
        with Image.open(path) as im:
            im = im.convert("L")
            if im.size != (size, size):
                # Area-averaging keeps thin strokes visible when downsampling (e.g. to 28x28).
                im = im.resize((size, size), Image.Resampling.BOX)
            return torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(size, size)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        # truncated, empty, corrupt or not an image (some Pillow decoders raise SyntaxError on a bad chunk)
        raise ConfigError(
            f"cannot read image '{path}' ({type(err).__name__}: {err}); replace or delete the file "
            "(every character folder needs the same number of drawings)"
        ) from None


def load_bank(root: str | os.PathLike[str], image_size: int = 105) -> Tensor:
    """All images of a folder as uint8 ``(C, K, image_size, image_size)`` (0 = ink, 255 = background).

    The first call reads the PNGs and caches the tensor as ``<root>/lit_icl_bank_<size>.pt`` (keyed by the
    folder's fingerprint); later calls load it in about a second.
    """
    index = index_folder(root)
    cache = Path(root) / f"lit_icl_bank_{image_size}.pt"
    fingerprint = index.fingerprint()
    if cache.is_file():
        try:
            saved = torch.load(cache, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError) as err:  # partial/foreign
            rank_zero_info(f"lit_icl.coqe: rebuilding the unreadable image cache {cache} ({type(err).__name__})")
        else:
            if tuple(saved.get("fingerprint", ())) == fingerprint and saved.get("class_names") == index.class_names:
                return saved["images"]
            rank_zero_info(f"lit_icl.coqe: the images under {root} changed; rebuilding {cache.name}")
    images = torch.stack(
        [torch.stack([_png_to_tensor(p, image_size) for p in cls]) for cls in index.files]
    )
    try:
        save_bank(index, images, fingerprint)
    except OSError as err:  # a read-only data folder still trains; the PNGs are read again next time
        rank_zero_info(f"lit_icl.coqe: cannot write the image cache {cache} ({err.strerror or err}); keeping the images in memory")
    return images


def save_bank(index: FolderIndex, images: Tensor, fingerprint: tuple[int, int] | None = None) -> Path:
    """Write the bank cache of ``index.root`` for ``images (C, K, S, S)`` (atomically: write, then rename)."""
    cache = index.root / f"lit_icl_bank_{images.shape[-1]}.pt"
    tmp = cache.with_suffix(f".tmp-{os.getpid()}")  # one per process: two runs may write at once
    fp = list(fingerprint if fingerprint is not None else index.fingerprint())
    try:
        with open(tmp, "wb") as fh:  # a Python file object, so a read-only folder is an OSError, not a RuntimeError
            torch.save({"images": images, "fingerprint": fp, "class_names": index.class_names}, fh)
        os.replace(tmp, cache)  # a concurrent reader never sees half a file
    finally:
        tmp.unlink(missing_ok=True)
    return cache

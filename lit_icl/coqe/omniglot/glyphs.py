"""``glyphs``: an offline stand-in for Omniglot, rendered from the DejaVu Sans font that matplotlib ships.

Omniglot is in no package registry, so runs without a network use this instead. It is *not* Omniglot and its
numbers are not the paper's. What it shares with Omniglot:

- 1,623 character classes in "alphabets" (Unicode scripts, at most 50 letters each, scripts interleaved so no
  script dominates), written in torchvision's folder layout ``images_background/`` (the first 964 classes) and
  ``images_evaluation/`` (the other 659), ``<alphabet>/characterNN/<id>_<drawer>.png``, so the same reader
  serves both sources;
- 20 "drawers" per class: each drawing applies its own random affine map (rotation, anisotropic scale,
  shear, shift), a smooth random displacement field (hand jitter) and a stroke width (thinner, as is,
  thicker) to the class's glyph, then binarises it; 105x105 black ink on white, like Omniglot's PNGs.

Only letters (Unicode categories L*) are used whose rendering is not nearly empty and whose 16x16 thumbnail
is at least ``MIN_DISTANCE`` (Euclidean) from every glyph kept before it, so no two classes share a shape. Everything is a pure function of ``seed``; drawings are generated in batches with
``torch.nn.functional.grid_sample`` (no per-image Python except writing the PNG files).

Build it with ``python -m lit_icl.coqe.omniglot.glyphs --out data/glyphs`` (the data module also builds it on first use);
it also writes the uint8 bank cache that training loads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import unicodedata
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_icl.coqe.omniglot.images import index_folder, save_bank
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator

DEFAULT_CLASSES = 1623  # as Omniglot
DEFAULT_DRAWERS = 20
BACKGROUND_CLASSES = 964  # Omniglot's images_background
SIZE = 105
ALPHABET_SIZE = 50
GLYPH_BOX = 62  # the glyph's longer side, in pixels, before the drawer's affine map
MIN_DISTANCE = 0.5  # between 16x16 thumbnails of two classes (about the 10 % quantile without the rule)


def font_path() -> Path:
    """DejaVu Sans from matplotlib's package data (Bitstream Vera licence; see data/README.md)."""
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not path.is_file():
        raise ConfigError(f"DejaVuSans.ttf not found at {path}; reinstall matplotlib")
    return path


def _render(font: object, ch: str) -> Tensor | None:
    """The glyph as ink in [0, 1], ``(SIZE, SIZE)``, its longer side scaled to ``GLYPH_BOX``, centred."""
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (200, 200), 0)
    ImageDraw.Draw(canvas).text((40, 30), ch, fill=255, font=font)
    box = canvas.getbbox()
    if box is None:
        return None
    crop = canvas.crop(box)
    w, h = crop.size
    if min(w, h) * GLYPH_BOX / max(w, h) < 14:  # dashes, bars and dots are not characters
        return None
    scale = GLYPH_BOX / max(w, h)
    crop = crop.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS)
    out = Image.new("L", (SIZE, SIZE), 0)
    out.paste(crop, ((SIZE - crop.size[0]) // 2, (SIZE - crop.size[1]) // 2))
    return torch.frombuffer(bytearray(out.tobytes()), dtype=torch.uint8).view(SIZE, SIZE).float() / 255.0


def select_glyphs(n_classes: int = DEFAULT_CLASSES) -> tuple[list[tuple[str, str]], Tensor]:
    """``([(alphabet, character), ...], prototypes (n, SIZE, SIZE))`` for ``n_classes`` distinct letters.

    Letters are grouped by script (first word of the Unicode name) into alphabets of at most
    ``ALPHABET_SIZE``; alphabets are taken round-robin over scripts so the set spans many scripts.
    """
    from fontTools.ttLib import TTFont
    from PIL import ImageFont

    path = font_path()
    font = ImageFont.truetype(str(path), 96)
    by_script: dict[str, list[str]] = defaultdict(list)
    for cp in sorted(TTFont(str(path)).getBestCmap()):
        ch = chr(cp)
        if not unicodedata.category(ch).startswith("L"):
            continue
        try:
            by_script[unicodedata.name(ch).split()[0]].append(ch)
        except ValueError:
            continue
    seen = torch.empty(n_classes, 256)  # thumbnails of the kept glyphs
    alphabets: dict[str, list[tuple[str, Tensor]]] = defaultdict(list)
    order: list[str] = []  # alphabet names, round-robin over scripts
    chunks = {script: 0 for script in sorted(by_script)}
    queues = {script: list(chars) for script, chars in sorted(by_script.items())}
    total = 0
    while total < n_classes and any(queues.values()):
        for script in sorted(queues):
            chars = queues[script]
            if not chars or total >= n_classes:
                continue
            name = f"{script.title()}_{chunks[script] + 1:02d}"
            while chars and len(alphabets[name]) < ALPHABET_SIZE and total < n_classes:
                ch = chars.pop(0)
                img = _render(font, ch)
                if img is None:
                    continue
                if img.mean() < 0.02:
                    continue
                key = F.adaptive_avg_pool2d(img[None, None], 16).flatten()
                # Near-duplicates (Latin "g" and Armenian "ց", "ë" and Cyrillic "ё", ...) would be two
                # classes with one shape: keep a glyph only if its 16x16 thumbnail is far from all kept ones.
                if total and float(((seen[:total] - key) ** 2).sum(1).min()) < MIN_DISTANCE**2:
                    continue
                seen[total] = key
                alphabets[name].append((ch, img))
                total += 1
            if alphabets.get(name):
                order.append(name)
                chunks[script] += 1
    if total < n_classes:
        raise ConfigError(f"only {total} distinct glyphs in {path}; ask for at most {total} classes")
    names = [(a, f"U{ord(ch):04X}") for a in order for ch, _ in alphabets[a]]
    protos = torch.stack([img for a in order for _, img in alphabets[a]])
    return names, protos


def draw(protos: Tensor, n_drawers: int, g: torch.Generator) -> Tensor:
    """``(C, n_drawers, SIZE, SIZE)`` uint8 drawings (0 = ink, 255 = paper) of the prototypes ``(C, SIZE, SIZE)``.

    Per drawing: rotation +-12 deg, scales 0.8-1.1 per axis, shear +-0.15, shift +-6 px; a displacement field
    of 5x5 Gaussian control points (about 1.5 px) interpolated bicubically; stroke width from a 3x3 erosion,
    nothing, or a 3x3 dilation; threshold at 0.5.
    """
    c = protos.shape[0]
    n = c * n_drawers
    x = protos.repeat_interleave(n_drawers, 0)[:, None]  # (n, 1, H, W)

    def uniform(lo: float, hi: float) -> Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=g)

    rot = uniform(-12, 12).deg2rad()
    sx, sy = uniform(0.8, 1.1), uniform(0.8, 1.1)
    shear = uniform(-0.15, 0.15)
    tx, ty = uniform(-6, 6) * 2 / SIZE, uniform(-6, 6) * 2 / SIZE
    cos, sin = rot.cos(), rot.sin()
    # Output -> input sampling map: rotation . shear . 1/scale.
    a = torch.stack(
        [
            torch.stack([cos / sx, (cos * shear - sin) / sy, tx], -1),
            torch.stack([sin / sx, (sin * shear + cos) / sy, ty], -1),
        ],
        1,
    )
    grid = F.affine_grid(a, (n, 1, SIZE, SIZE), align_corners=False)
    jitter = torch.randn(n, 2, 5, 5, generator=g) * (1.5 * 2 / SIZE)
    # Smooth field: bicubic to 21x21, then bilinear to full size (bicubic at 105x105 is 4x slower on CPU).
    jitter = F.interpolate(jitter, size=(21, 21), mode="bicubic", align_corners=True)
    grid = grid + F.interpolate(jitter, size=(SIZE, SIZE), mode="bilinear", align_corners=True).permute(0, 2, 3, 1)
    y = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[:, 0]
    width = torch.randint(3, (n,), generator=g)
    # Each drawing takes one stroke width, so each morphology runs on its own drawings only.
    thin, thick = width == 0, width == 2
    y[thin], y[thick] = _morph(y[thin], erode=True), _morph(y[thick], erode=False)
    ink = y > 0.5
    return (~ink).to(torch.uint8).mul_(255).view(c, n_drawers, SIZE, SIZE)


def _morph(y: Tensor, erode: bool) -> Tensor:
    """3x3 grey erosion (min) or dilation (max) of ``(n, H, W)``, outside pixels 0: the min (max) of each row's 3
    neighbours, then of 3 such rows (min and max are exact, so this equals the 3x3 window's; ``max_pool2d`` with
    stride 1 is several times slower on CPU)."""
    pad = F.pad(y, (1, 1, 1, 1), value=0.0)
    h, w = y.shape[-2:]
    op = torch.minimum if erode else torch.maximum
    rows = op(op(pad[..., 0:w], pad[..., 1 : w + 1]), pad[..., 2 : w + 2])  # (n, H + 2, W)
    return op(op(rows[:, 0:h], rows[:, 1 : h + 1]), rows[:, 2 : h + 2])


def build_glyphs(
    out: str | os.PathLike[str], n_classes: int = DEFAULT_CLASSES, n_drawers: int = DEFAULT_DRAWERS, seed: int = 0
) -> Path:
    """Render the stand-in into ``out`` (Omniglot layout) and write its 105x105 bank cache; returns ``out``.

    Written, bank cache included, into a temporary sibling folder of this process and renamed at the end, so an
    interrupted build leaves nothing that looks complete, and two runs that start on a fresh machine at the same
    time (``experiments/coqe_omniglot_cpu.py --jobs 2``) both succeed: the second rename finds the folder built
    (same seed, same content) and discards its own copy.
    """
    if n_classes < 2 or n_drawers < 1:
        raise ConfigError(f"n_classes={n_classes}, n_drawers={n_drawers}: need >= 2 classes and >= 1 drawer")
    out = Path(out)
    if out.exists():
        raise ConfigError(f"{out} exists already; delete it to rebuild the glyphs stand-in")
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    try:
        _build_into(tmp, n_classes, n_drawers, seed)
        try:
            os.replace(tmp, out)
        except OSError:
            if not out.is_dir():
                raise
            # Another process finished the same build first; its folder is the one readers may already use.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build_into(tmp: Path, n_classes: int, n_drawers: int, seed: int) -> None:
    """Draw the glyphs into ``tmp`` (Omniglot layout) and write its 105x105 bank cache there."""
    from PIL import Image

    shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a killed build of the same pid
    names, protos = select_glyphs(n_classes)
    g = make_generator("glyphs-drawers", seed)
    n_background = min(BACKGROUND_CLASSES, n_classes - 1) if n_classes > BACKGROUND_CLASSES else n_classes // 2
    per_alphabet: dict[str, int] = defaultdict(int)
    folders: list[tuple[str, str, str]] = []
    bank = torch.empty(n_classes, n_drawers, SIZE, SIZE, dtype=torch.uint8)
    for start in range(0, n_classes, 256):  # bounded memory: 256 classes x 20 drawings at a time
        drawings = draw(protos[start : start + 256], n_drawers, g)
        bank[start : start + len(drawings)] = drawings
        for i in range(drawings.shape[0]):
            cid = start + i
            alphabet, code = names[cid]
            per_alphabet[alphabet] += 1
            split = "images_background" if cid < n_background else "images_evaluation"
            char = f"character{per_alphabet[alphabet]:02d}_{code}"
            folders.append((split, alphabet, char))
            folder = tmp / split / alphabet / char
            folder.mkdir(parents=True, exist_ok=True)
            for d in range(n_drawers):
                img = Image.frombytes("L", (SIZE, SIZE), drawings[i, d].numpy().tobytes()).convert("1")
                img.save(folder / f"{cid + 1:04d}_{d + 1:02d}.png", optimize=False)
    index = index_folder(tmp)
    # Class order of the reader (sorted folder names) differs from the build order: permute the bank to it.
    built = {f"{split}/{a}/{c}": i for i, (split, a, c) in enumerate(folders)}
    save_bank(index, bank[torch.tensor([built[name] for name in index.class_names])])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_icl.coqe.omniglot.glyphs", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/glyphs", help="target folder (default data/glyphs)")
    parser.add_argument("--classes", type=int, default=DEFAULT_CLASSES)
    parser.add_argument("--drawers", type=int, default=DEFAULT_DRAWERS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        build_glyphs(args.out, args.classes, args.drawers, args.seed)
    except ConfigError as err:
        raise SystemExit(f"lit_icl.coqe.omniglot.glyphs: error: {err}") from None
    print(f"built {args.classes} classes x {args.drawers} drawers in {args.out} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()

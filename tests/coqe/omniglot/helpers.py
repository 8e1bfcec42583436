"""Helpers of the CoQE Omniglot tests: a tiny Omniglot-layout folder and the CLI arguments of a seconds-long run."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import quiet_run_args
from PIL import Image


def write_omniglot_fixture(
    root: Path, n_classes: int = 24, n_drawers: int = 4, size: int = 16, per_alphabet: int = 5
) -> Path:
    """A tiny folder in torchvision's Omniglot layout; pixel (0, 0) = class id, (0, 1) = drawer, rest random.

    Alphabet and character names are created in *reverse* order, so a reader that relies on creation order
    fails the order checks. Returns the folder (the equivalent of ``omniglot-py``).
    """
    g = torch.Generator().manual_seed(0)
    n_bg = n_classes // 2
    for cid in reversed(range(n_classes)):
        split = "images_background" if cid < n_bg else "images_evaluation"
        local = cid if cid < n_bg else cid - n_bg
        folder = root / split / f"Alphabet_{local // per_alphabet:02d}" / f"character{local % per_alphabet + 1:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for d in reversed(range(n_drawers)):
            img = (torch.rand(size, size, generator=g) > 0.5).to(torch.uint8) * 255
            img[0, 0], img[0, 1] = cid, d
            Image.fromarray(img.numpy(), mode="L").save(folder / f"{cid + 1:04d}_{d + 1:02d}.png")
    return root


BASE = "configs/coqe/omniglot.yaml"
TRANSFORMER = (BASE, "configs/coqe/omniglot/transformer.yaml")
#: The base alone, the base with each overlay, and the CPU-scale Transformer (two overlays).
SHIPPED: list[tuple[str, ...]] = [
    (BASE,),
    *((BASE, f"configs/coqe/omniglot/{p.name}") for p in sorted((Path(__file__).parents[3] / "configs/coqe/omniglot").glob("*.yaml"))),
    (BASE, "configs/coqe/omniglot/cpu.yaml", "configs/coqe/omniglot/transformer.yaml"),
]


def coqe_args(tmp_path: Path, *extra: str, config: str | tuple[str, ...] = BASE) -> list[str]:
    """A seconds-long run: 24 classes x 4 drawings of 16x16 pixels, a tiny ResNet, 1-layer Transformer.

    The net's class count is not given: it comes from the data module (20 training classes)."""
    folder = tmp_path / "omniglot-py"
    if not folder.exists():
        write_omniglot_fixture(folder)
    return [
        *quiet_run_args(tmp_path, config),
        "--trainer.accelerator", "cpu",
        "--trainer.max_steps", "4",
        "--trainer.log_every_n_steps", "1",
        "--data.init_args.source", "omniglot",
        "--data.init_args.folder", str(folder),
        "--data.init_args.image_size", "16",
        "--data.init_args.n_holdout", "4",
        "--data.init_args.n_common", "2",
        "--data.init_args.batch_size", "8",
        "--data.init_args.chunk_size", "4",
        "--data.init_args.train_batches_per_epoch", "2",
        "--data.init_args.val_sequences", "8",
        "--data.init_args.test_sequences", "16",
        "--data.init_args.eval_batch_size", "8",
        "--model.init_args.net.init_args.resnet_channels", "[8, 8, 8, 16]",
        "--model.init_args.net.init_args.depth", "1",
        *extra,
    ]

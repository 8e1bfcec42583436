"""The offline sentiment tasks of ``python -m lit_icl.i2cl.prepare``, built from a miniature vaderSentiment sdist."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from lit_icl.i2cl.prepare import SENTIMENT_FILES, main, read_snippets, write_sentiment_task

# (rating, text) per task; ratings of exactly 0 must be dropped, the sign gives the label
ROWS = {
    "movie_reviews": [(2.5, "A gem of a film."), (-1.2, "Tepid."), (0.0, "A film."), (0.3, "Münch's insight.")]
    + [((-1) ** i * (i + 1) / 10, f"review {i}") for i in range(16)],
    "tweets": [(1.0, "Café time!"), (-3.0, "worst day"), (0.0, "ok")] + [(-0.5 + i / 20, f"tweet {i}") for i in range(9)],
    "nyt_editorials": [(0.4, "An editorial."), (-0.15, "A grim one.")],
    "amazon_reviews": [(-0.9, "no picture."), (1.5, "works great"), (0.0, "a dvd player")],
}


def make_sdist(path: Path) -> Path:
    """The sdist's layout: a tarball whose additional_resources/ holds hutto_ICWSM_2014.tar.gz (CRLF, UTF-8 files)."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        for task, rows in ROWS.items():
            data = "".join(f"{i + 1}\t{r}\t{t}\r\n" for i, (r, t) in enumerate(rows)).encode("utf-8")
            info = tarfile.TarInfo(f"hutto_ICWSM_2014/{SENTIMENT_FILES[task]}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = inner.getvalue()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_tasks_are_labelled_by_sign_and_split_80_20_without_overlap(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path / "vaderSentiment-3.3.2.tar.gz")
    for task, rows in ROWS.items():
        counts = write_sentiment_task(sdist, task, tmp_path / task)
        train, test = (read_jsonl(tmp_path / task / f"{s}.jsonl") for s in ("train", "test"))
        kept = [(t, int(r > 0)) for r, t in rows if r != 0]
        assert counts == {"test": round(0.2 * len(kept)), "train": len(kept) - round(0.2 * len(kept))}
        got = [(x["text"], x["label"]) for x in train + test]
        assert sorted(got) == sorted((t if task != "movie_reviews" else t.encode().decode("latin-1"), y) for t, y in kept)
        assert not {x["text"] for x in train} & {x["text"] for x in test}
        assert all("\r" not in x["text"] for x in train + test)
    # the new tasks are decoded as UTF-8; movie_reviews keeps its latin-1 reading (the data behind the README tables)
    assert "Café time!" in [t for _, t in read_snippets(sdist, "tweets")]
    assert "MÃ¼nch's insight." in [t for _, t in read_snippets(sdist, "movie_reviews")]


def test_split_is_seeded_and_differs_by_seed(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path / "v.tar.gz")
    write_sentiment_task(sdist, "movie_reviews", tmp_path / "a")
    write_sentiment_task(sdist, "movie_reviews", tmp_path / "b")
    write_sentiment_task(sdist, "movie_reviews", tmp_path / "c", seed=1)
    assert (tmp_path / "a" / "test.jsonl").read_bytes() == (tmp_path / "b" / "test.jsonl").read_bytes()
    assert (tmp_path / "a" / "test.jsonl").read_bytes() != (tmp_path / "c" / "test.jsonl").read_bytes()


def test_main_writes_the_missing_tasks_only(tmp_path: Path, capsys) -> None:
    sdist = make_sdist(tmp_path / "v.tar.gz")
    out = tmp_path / "i2cl"
    write_sentiment_task(sdist, "movie_reviews", out / "movie_reviews")
    marker = out / "movie_reviews" / "test.jsonl"
    marker.write_text('{"text": "kept", "label": 1}\n')  # present tasks are not rebuilt
    main(["--out", str(out), "--vader-sdist", str(sdist), "--skip-model"])
    printed = capsys.readouterr().out
    assert f"{out / 'movie_reviews'}: present" in printed
    for task in ("tweets", "nyt_editorials", "amazon_reviews"):
        assert f"{out / task}: wrote" in printed and (out / task / "train.jsonl").exists()
    assert marker.read_text() == '{"text": "kept", "label": 1}\n'


def test_a_wrong_sdist_is_refused_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        main(["--out", str(tmp_path / "o"), "--vader-sdist", str(tmp_path / "missing.tar.gz"), "--skip-model"])
    other = tmp_path / "other.tar.gz"
    with tarfile.open(other, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    with pytest.raises(SystemExit, match="not the vadersentiment==3.3.2 sdist"):
        main(["--out", str(tmp_path / "o"), "--vader-sdist", str(other), "--skip-model"])

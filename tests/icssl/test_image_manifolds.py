"""IC-SSL image manifolds (App. E.3): the folder reader on a tiny fixture in the on-disk layout, episodes,
the stand-in built on first use, and a CLI run on a miniature (the builders themselves: test_build.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.icssl.build import build_image_standin
from lit_icl.icssl.image_manifolds import ImageManifoldDataModule, read_sequences, write_cache


def _write_fixture(root: Path, sequences: int = 4, frames: int = 6, size: int = 8) -> list[torch.Tensor]:
    """RGB frames whose three channels differ, so grayscale conversion is exercised; frame t of sequence s
    has a known constant colour."""
    truth = []
    for s in range(sequences):
        folder = root / f"seq_{s + 1:04d}"
        folder.mkdir(parents=True)
        seq = []
        for t in range(frames):
            rgb = torch.tensor([10 * t + s, 20 * t, 5 * s], dtype=torch.uint8)[:, None, None].expand(3, size, size)
            hwc = rgb.permute(1, 2, 0).contiguous()
            Image.frombytes("RGB", (size, size), hwc.numpy().tobytes()).save(folder / f"frame_{t:03d}.png")
            seq.append(rgb.float())
        truth.append(torch.stack(seq))
    (root / "notes.txt").write_text("not a sequence")
    return truth


def test_reader_follows_app_e3_processing(tmp_path) -> None:
    truth = _write_fixture(tmp_path)
    frames, from_cache = read_sequences(tmp_path, image_size=4)
    assert frames.shape == (4, 6, 16) and not from_cache
    # Grayscale (ITU-R 601 weights, as PIL) of a constant image stays constant after resizing.
    for s in range(4):
        gray = (0.299 * truth[s][:, 0, 0, 0] + 0.587 * truth[s][:, 1, 0, 0] + 0.114 * truth[s][:, 2, 0, 0]) / 255
        torch.testing.assert_close(frames[s].mean(-1), gray, atol=1.5 / 255, rtol=0)
        assert frames[s].std(-1).max() < 1e-6
    assert write_cache(tmp_path, 4, frames) == tmp_path / ".frames_4px.pt"
    again, from_cache = read_sequences(tmp_path, image_size=4)
    assert from_cache
    torch.testing.assert_close(again, frames)


def test_missing_data_says_where_it_goes_and_how_to_build_the_standin(tmp_path) -> None:
    # The stand-in is offered where runs build it, not at the missing path (one's own sequences go there).
    with pytest.raises(ConfigError, match="python -m lit_icl.icssl.build image-standin --out "
                                          "data/image_manifolds_standin"):
        read_sequences(tmp_path / "nothing")


def test_episodes_label_halves_split_sequences_and_fix_the_test_set(tmp_path) -> None:
    _write_fixture(tmp_path, sequences=5, frames=6)
    dm = ImageManifoldDataModule(root=str(tmp_path), n_points=6, image_size=4, pixel_scale=1e-3,
                                 train_sequences=3, val_sequences=1, batch_size=2, eval_batch_size=2,
                                 train_batches_per_epoch=2, train_label_ratio=(0.2, 0.5),
                                 eval_label_ratios=[0.34])
    frames, _ = read_sequences(tmp_path, image_size=4)
    test = dm.on_after_batch_transfer(next(iter(dm.test_dataloader())), 0)  # frames gathered after the transfer
    assert test["x"].shape == (2, 6, 16) and test["y"].shape == (2, 6)
    for e in range(2):  # test = sequences 4 and 5, each frame once, label = second half of the sequence
        seq = frames[3 + e] * 1e-3
        match = torch.cdist(test["x"][e], seq).argmin(-1)
        assert sorted(match.tolist()) == list(range(6))
        assert torch.equal(test["y"][e], (match >= 3).long())
    again = dm.on_after_batch_transfer(next(iter(dm.test_dataloader())), 0)
    assert torch.equal(again["x"], test["x"])
    train = next(iter(dm.train_dataloader()))
    assert train["n_labeled"].min() >= 1 and train["n_labeled"].max() <= 3
    splits = [(len(frames), first) for frames, first in map(dm._split, ("train", "val", "test"))]
    assert splits == [(2, 0), (1, 2), (2, 3)]  # sequences of each split, and the first one's index
    # Every split ships frame ids; gathered, they are bit for bit the points a host-built episode holds.
    loaders = {"train": dm.train_dataloader(), "val": dm.val_dataloader(), "test": dm.test_dataloader()}
    for split, loader in loaders.items():
        shipped = next(iter(loader))
        assert "x" not in shipped
        on_host = dm.dataset(split)
        on_host.ids_only = False
        made = torch.cat([on_host[i]["x"] for i in range(len(shipped["y"]))])
        got = dm.on_after_batch_transfer(shipped, 0)["x"]
        assert torch.equal(got, made) and torch.equal(got, frames.flatten(0, 1)[shipped["ids"]] * 1e-3)


def test_cli_evaluates_on_image_manifolds(tmp_path) -> None:
    build_image_standin(tmp_path / "data", sequences=6, frames=10, size=8, latent_dim=4)
    args = [
        "test", "--config", "configs/icssl/image_manifolds.yaml",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", "img",
        "--trainer.enable_progress_bar", "false",
        "--trainer.callbacks", "[]",
        "--model.init_args.net.init_args.representation.init_args.n_points", "10",
        "--model.init_args.net.init_args.representation.init_args.stack_repeats", "1",
        "--data.init_args.root", str(tmp_path / "data"),
        "--data.init_args.n_points", "10",
        "--data.init_args.image_size", "8",
        "--data.init_args.train_sequences", "4",
        "--data.init_args.val_sequences", "1",
        "--data.init_args.eval_label_ratios", "[0.2, 0.5]",
        "--data.init_args.train_label_ratio", "[0.2, 0.5]",
    ]
    main(args)
    rows = json.loads((tmp_path / "runs/img/version_0/results.json").read_text())["rows"]
    acc = [r for r in rows if r["metric"] == "accuracy" and r["method"] == "ORIG+E2E-ICL"]
    assert [r["n_labeled"] for r in acc] == [2, 5]
    prior = [r for r in rows if r["metric"] == "accuracy" and r["method"] == "class_prior"]
    assert all(0.5 <= r["value"] <= 0.75 for r in prior), prior  # halves: balanced up to the labeled points


def test_a_model_trained_on_synthetic_manifolds_is_tested_zero_shot_on_image_manifolds(tmp_path) -> None:
    """Table 5's OOD column: the checkpoint of a manifolds run, tested with the image-manifold data module."""
    size = ["--model.init_args.net.init_args.representation.init_args.n_points", "10",
            "--model.init_args.net.init_args.representation.init_args.stack_repeats", "1"]
    main(["fit", "--config", "configs/icssl/manifolds.yaml", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
          "--trainer.logger.init_args.name", "synthetic", "--trainer.enable_progress_bar", "false",
          "--trainer.max_epochs", "1", "--trainer.callbacks", "[]", *size, "--data.init_args.n_points", "10",
          "--data.init_args.batch_size", "4", "--data.init_args.chunk_size", "4", "--data.init_args.train_batches_per_epoch", "2",
          "--data.init_args.val_episodes", "4", "--data.init_args.eval_label_ratios", "[0.2, 0.5]",
          "--data.init_args.train_label_ratio", "[0.2, 0.5]"])
    ckpt = tmp_path / "runs/synthetic/version_0/checkpoints/last.ckpt"
    build_image_standin(tmp_path / "data", sequences=6, frames=10, size=8, latent_dim=4)
    args = ["--config", "configs/icssl/image_manifolds.yaml", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
            "--trainer.logger.init_args.name", "transfer", "--trainer.enable_progress_bar", "false",
            "--trainer.callbacks", "[]", *size, "--data.init_args.root", str(tmp_path / "data"),
            "--data.init_args.n_points", "10", "--data.init_args.image_size", "8",
            "--data.init_args.train_sequences", "4", "--data.init_args.val_sequences", "1",
            "--data.init_args.eval_label_ratios", "[0.2, 0.5]", "--data.init_args.train_label_ratio", "[0.2, 0.5]",
            "--ckpt_path", str(ckpt)]
    main(["test", *args])
    results = json.loads((tmp_path / "runs/transfer/version_0/results.json").read_text())
    assert results["meta"]["checkpoint"] == str(ckpt) and results["meta"]["trained_steps"] == 2
    acc = [r for r in results["rows"] if r["metric"] == "accuracy" and r["method"] == "ORIG+E2E-ICL"]
    assert [r["n_labeled"] for r in acc] == [2, 5]
    # Resuming training on the other data module is still refused: that is not a transfer test.
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args])
    assert stop.value.code == 2


def test_stale_or_broken_cache_is_rebuilt(tmp_path) -> None:
    _write_fixture(tmp_path, sequences=2, frames=4)
    first, _ = read_sequences(tmp_path, image_size=4)
    cache = write_cache(tmp_path, 4, first)
    cache.write_bytes(b"not a tensor file")
    again, from_cache = read_sequences(tmp_path, image_size=4)
    assert not from_cache  # the broken cache is decoded again
    torch.testing.assert_close(again, first)
    write_cache(tmp_path, 4, again)  # a good cache, but of the folder list before the change below
    _write_fixture(tmp_path / "more", sequences=1, frames=4)  # not a sequence folder of ROOT itself
    (tmp_path / "seq_0003").mkdir()
    Image.new("RGB", (8, 8), (9, 9, 9)).save(tmp_path / "seq_0003" / "frame_000.png")
    with pytest.raises(ConfigError, match="different frame counts"):
        read_sequences(tmp_path, image_size=4)  # the folder list changed, so the cache is not reused


# ----------------------------------------------------------------------------------------------------------
# Broken frames, sizes checked before anything is written, read-only data folders
# ----------------------------------------------------------------------------------------------------------
def _image_args(tmp_path: Path, root: Path, *extra: str, command: str = "fit") -> list[str]:
    """A seconds-long run on a ``_write_fixture(root, frames=10)`` folder (4 sequences: 2 train, 1 val, 1 test)."""
    return [
        command, "--config", "configs/icssl/image_manifolds.yaml",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", "img",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.max_epochs", "1",
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.callbacks", "[]",
        "--model.init_args.net.init_args.representation.init_args.n_points", "10",
        "--model.init_args.net.init_args.representation.init_args.n_components", "4",
        "--model.init_args.net.init_args.representation.init_args.stack_repeats", "1",
        "--data.init_args.root", str(root),
        "--data.init_args.n_points", "10",
        "--data.init_args.image_size", "4",
        "--data.init_args.train_sequences", "3",
        "--data.init_args.val_sequences", "1",
        "--data.init_args.batch_size", "2",
        "--data.init_args.eval_batch_size", "2",
        "--data.init_args.train_batches_per_epoch", "2",
        "--data.init_args.eval_label_ratios", "[0.2, 0.5]",
        "--data.init_args.train_label_ratio", "[0.2, 0.5]",
        *extra,
    ]  # fmt: skip


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


#: (how the fixture is damaged, extra CLI args, needle): broken frames, and sizes that do not fit the data.
BAD_FRAMES = [
    (lambda r: _truncate(r / "seq_0002" / "frame_003.png"), [], "cannot read image-manifold frame"),
    (lambda r: (r / "seq_0001" / "frame_000.png").write_bytes(b""), [], "frame_000.png (it is empty)"),
    (lambda r: (r / "seq_0004" / "frame_009.png").write_text("not a picture"), [], "UnidentifiedImageError"),
    (lambda r: (r / "seq_0003" / "frame_002.png").unlink(), [], "different frame counts [9, 10]"),
    (lambda r: None, ["--data.init_args.n_points", "12",
                      "--model.init_args.net.init_args.representation.init_args.n_points", "12"],
     "have 10 frames, fewer than n_points=12"),
    (lambda r: None, ["--data.init_args.train_sequences", "4"], "holds 4 sequences but train_sequences=4"),
]


@pytest.mark.parametrize(("damage", "extra", "needle"), BAD_FRAMES, ids=[r[2][:40] for r in BAD_FRAMES])
def test_broken_frames_and_unfit_sizes_are_one_line_and_write_no_cache(tmp_path, capsys, damage, extra, needle) -> None:
    from badinput import assert_rejected

    root = tmp_path / "data"
    _write_fixture(root, frames=10)
    damage(root)
    before = _files(tmp_path)
    line = assert_rejected(tmp_path, capsys, _image_args(tmp_path, root, *extra), needle)
    assert str(root) in line
    assert _files(tmp_path) == before, "no frame cache (or anything else) written before the input is checked"


def test_valid_frames_are_cached_only_once_the_run_starts(tmp_path) -> None:
    root = tmp_path / "data"
    _write_fixture(root, frames=10)
    dm = ImageManifoldDataModule(root=str(root), n_points=10, image_size=4, train_sequences=3, val_sequences=1,
                                 eval_label_ratios=[0.5], train_label_ratio=(0.2, 0.5))
    dm.check_config()
    assert not (root / ".frames_4px.pt").exists(), "checks decode in memory only"
    dm.setup("fit")
    assert (root / ".frames_4px.pt").exists() and not list(root.glob("*.tmp"))
    again = ImageManifoldDataModule(root=str(root), n_points=10, image_size=4, train_sequences=3, val_sequences=1,
                                    eval_label_ratios=[0.5], train_label_ratio=(0.2, 0.5))
    torch.testing.assert_close(again.frames(), dm.frames())
    assert again._from_cache


def test_a_read_only_data_folder_still_runs_with_frames_in_memory(tmp_path, monkeypatch) -> None:
    """Writes into the data folder fail as on a read-only mount (EACCES; tests may run as root, where chmod does
    not stop writes); the run trains and tests on frames decoded in memory and leaves the folder untouched."""
    import lit_icl.icssl.image_manifolds as im

    root = tmp_path / "data"
    _write_fixture(root, frames=10)
    before = _files(root)

    def read_only_open(path, mode="r", *args, **kwargs):
        if any(m in mode for m in "wax+") and Path(path).resolve().is_relative_to(root.resolve()):
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, mode, *args, **kwargs)

    said: list[str] = []
    monkeypatch.setattr(im, "open", read_only_open, raising=False)
    monkeypatch.setattr(im, "rank_zero_info", said.append)
    main(_image_args(tmp_path, root))
    assert list((tmp_path / "runs" / "img" / "version_0" / "checkpoints").glob("*.ckpt"))
    assert _files(root) == before
    assert len(said) == 1 and "not caching frames in" in said[0] and "PermissionError" in said[0], said


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes through chmod")
def test_a_chmod_read_only_data_folder_still_loads(tmp_path) -> None:
    root = tmp_path / "data"
    _write_fixture(root, frames=10)
    os.chmod(root, 0o555)
    try:
        dm = ImageManifoldDataModule(root=str(root), n_points=10, image_size=4, train_sequences=3, val_sequences=1,
                                     eval_label_ratios=[0.5], train_label_ratio=(0.2, 0.5))
        dm.check_config()
        dm.setup("fit")
        assert dm.frames().shape == (4, 10, 16) and not (root / ".frames_4px.pt").exists()
    finally:
        os.chmod(root, 0o755)


# ----------------------------------------------------------------------------------------------------------
# The stand-in built on first use
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def small_standin(tmp_path, monkeypatch):
    """Run in an empty working folder with a 12-sequence, 10-frame stand-in (the real one: 600 x 100)."""
    import lit_icl.icssl.image_manifolds as im

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(im, "STANDIN_SEQUENCES", 12)
    monkeypatch.setattr(im, "STANDIN_FRAMES", 10)
    return {"n_points": 10, "train_sequences": 8, "val_sequences": 2, "batch_size": 2, "eval_batch_size": 2,
            "train_label_ratio": (0.1, 0.5), "eval_label_ratios": [0.2]}


def test_only_the_stand_ins_own_missing_folder_is_built(tmp_path, small_standin) -> None:
    assert ImageManifoldDataModule(**small_standin).builds_standin()
    assert not ImageManifoldDataModule(**small_standin, build_standin=False).builds_standin()
    mistyped = ImageManifoldDataModule(**small_standin, root="data/my_images")  # one's own data: an error
    assert not mistyped.builds_standin()
    with pytest.raises(ConfigError, match="no image-manifold sequences under data/my_images"):
        mistyped.check_config()


def test_the_stand_in_is_checked_by_its_shape_then_built_whole_on_first_use(tmp_path, small_standin) -> None:
    too_long = ImageManifoldDataModule(**{**small_standin, "n_points": 11})
    with pytest.raises(ConfigError, match="have 10 frames, fewer than n_points=11"):
        too_long.check_config()
    dm = ImageManifoldDataModule(**small_standin)
    dm.check_config()
    assert not (tmp_path / "data").exists(), "the checks write nothing"
    dm.prepare_data()
    root = tmp_path / "data/image_manifolds_standin"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["image_manifolds_standin"]  # no .partial left
    assert len(list(root.glob("seq_*"))) == 12 and len(list(root.glob("seq_0001/*.png"))) == 10
    dm.setup("fit")
    # The same frames as the stand-in command writes (it is a pure function of its seed).
    build_image_standin(tmp_path / "by_hand", 12, 10)
    assert torch.equal(dm.frames(), read_sequences(tmp_path / "by_hand")[0])
    assert not ImageManifoldDataModule(**small_standin).builds_standin(), "built once"

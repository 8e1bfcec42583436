"""IC-SSL on image features (Sec. 4.2): the feature-file episodes, the stand-in built on first use, and the CLI
(feature extraction itself: test_build.py; the dataset-size sweep: test_sweep.py)."""

from __future__ import annotations

import json

import pytest
import torch

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.icssl import ICSSLModule
from lit_icl.icssl.features import FeatureEpisodeDataModule, load_features


def _feature_file(path, classes: int = 4, per_class: int = 20, dim: int = 6) -> dict:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(classes).repeat_interleave(per_class)
    feats = torch.randn(classes * per_class, dim, generator=g) + 3 * torch.eye(classes, dim)[labels]
    data = {"features": feats, "labels": labels, "classes": [f"c{c}" for c in range(classes)]}
    torch.save(data, path)
    return data


def _dm(path, **kw) -> FeatureEpisodeDataModule:
    args = {"features": str(path), "per_class": 5, "train_episodes": 3, "val_episodes": 4, "test_episodes": 4,
            "test_fraction": 0.3, "normalize": "none", "feature_scale": 1.0, "batch_size": 2, "eval_batch_size": 4,
            "train_batches_per_epoch": 3, "train_label_ratio": (0.2, 0.5), "eval_label_ratios": [0.2]}
    args.update(kw)
    return FeatureEpisodeDataModule(**args)


def test_episodes_hold_two_classes_of_unseen_images(tmp_path) -> None:
    data = _feature_file(tmp_path / "f.pt")
    dm = _dm(tmp_path / "f.pt")
    train_rows, test_rows = set(), set()
    for loader, rows in ((dm.train_dataloader(), train_rows), (dm.test_dataloader(), test_rows)):
        for shipped in loader:
            batch = dm.on_after_batch_transfer(shipped, 0)  # the features are gathered after the transfer
            assert batch["x"].shape[1:] == (10, 6)
            for x, y in zip(batch["x"], batch["y"]):
                idx = torch.cdist(x, data["features"]).argmin(-1)  # which stored image each point is
                cls = data["labels"][idx]
                assert cls.unique().numel() == 2 and (y == 1).sum() == 5
                # One class per label: the episode's 0/1 labels are a relabelling of its two classes.
                assert all((cls[y == v] == cls[y == v][0]).all() for v in (0, 1))
                rows.update(idx.tolist())
    assert not train_rows & test_rows, "test episodes only use held-out images"


def test_dataset_size_is_a_fixed_pool_of_episodes(tmp_path) -> None:
    _feature_file(tmp_path / "f.pt")
    dm = _dm(tmp_path / "f.pt")
    ds = dm.train_dataloader().dataset
    assert len(ds) == 3
    assert torch.equal(ds[1]["ids"], ds[1 + 3]["ids"])  # the next epoch revisits the same episodes
    assert not torch.equal(ds[0]["ids"], ds[1]["ids"])


def test_the_loader_ships_image_ids_and_the_features_are_gathered_bit_identical(tmp_path) -> None:
    """Each batch crosses to the device as image ids (a 16 MB batch of features on the paper's sizes would cross
    at every step); gathered there, its points are bit for bit the scaled features a host-built episode holds."""
    data = _feature_file(tmp_path / "f.pt")
    dm = _dm(tmp_path / "f.pt", feature_scale=0.1, normalize="l2")
    for split, loader in (("train", dm.train_dataloader()), ("test", dm.test_dataloader())):
        shipped = next(iter(loader))
        assert "x" not in shipped and shipped["ids"].shape == (len(shipped["y"]), 10)
        on_host = dm.dataset(split)
        on_host.ids_only = False  # what the loader shipped before: the points themselves
        made = torch.cat([on_host[i]["x"] for i in range(len(shipped["y"]))])
        got = dm.on_after_batch_transfer(shipped, 0)
        assert torch.equal(got["x"], made) and torch.equal(got["y"], shipped["y"])
        # ... and the formula itself: the l2-normalised features of those images, times feature_scale.
        assert torch.equal(got["x"], torch.nn.functional.normalize(data["features"], dim=-1)[shipped["ids"]] * 0.1)


def test_missing_or_small_feature_files_are_refused(tmp_path) -> None:
    # The stand-in is offered where runs build it, not at the missing path (one's own features go there).
    with pytest.raises(ConfigError, match="python -m lit_icl.icssl.build features-standin --out "
                                          "data/features_standin.pt"):
        load_features(tmp_path / "none.pt")
    _feature_file(tmp_path / "f.pt", per_class=6)
    with pytest.raises(ConfigError, match="fewer than per_class=5"):
        _dm(tmp_path / "f.pt").check_config()


PROJECTED = "configs/icssl/features/projected.yaml"


@pytest.mark.parametrize("projected", [False, True], ids=["features", "features+projected"])
def test_cli_fits_tests_and_reloads_on_features(tmp_path, projected: bool) -> None:
    _feature_file(tmp_path / "f.pt", per_class=40, dim=8)
    # The eigenmap's options sit one level deeper behind the learned projection (projected.yaml).
    eigenmap = "--model.init_args.net.init_args.representation" + (".init_args.representation" if projected else "")
    overlay = ["--config", PROJECTED,
               "--model.init_args.net.init_args.representation.init_args.input_dim", "8"] if projected else []
    args = ["--config", "configs/icssl/features.yaml", *overlay,
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.logger.init_args.name", "f",
            "--trainer.enable_progress_bar", "false", "--trainer.callbacks", "[]", "--trainer.max_epochs", "1",
            f"{eigenmap}.init_args.n_points", "20", f"{eigenmap}.init_args.stack_repeats", "1",
            "--data.init_args.features", str(tmp_path / "f.pt"), "--data.init_args.per_class", "10",
            "--data.init_args.train_episodes", "6", "--data.init_args.batch_size", "2",
            "--data.init_args.train_batches_per_epoch", "2", "--data.init_args.val_episodes", "4",
            "--data.init_args.test_episodes", "8", "--data.init_args.eval_batch_size", "8",
            "--data.init_args.eval_label_ratios", "[0.1, 0.4]"]
    main(["fit", *args])
    ckpt = tmp_path / "runs/f/version_0/checkpoints/last.ckpt"
    # Tested without repeating the pool's size (default 5000): the rows carry what the weights were trained on.
    i = args.index("--data.init_args.train_episodes")
    main(["test", *args[:i], *args[i + 2:], "--ckpt_path", str(ckpt)])
    rows = json.loads((tmp_path / "runs/f/version_1/results.json").read_text())["rows"]
    prior = [r["value"] for r in rows if r["method"] == "class_prior" and r["metric"] == "accuracy"]
    assert len(prior) == 2 and all(0.5 <= v <= 0.7 for v in prior)
    assert {r.get("dataset_size") for r in rows if r["metric"] == "accuracy"} == {6}
    model = ICSSLModule.load_from_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=False)["state_dict"]
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    representation = model.net.representation
    assert type(representation).__name__ == ("ProjectedRepresentation" if projected else "InContextEigenmap")
    if projected:  # the trained projection came back, with the eigenmap behind it
        assert representation.projection.weight.shape == (64, 8) and representation.n_points == 20


# ----------------------------------------------------------------------------------------------------------
# The stand-in built on first use (the real build needs Fashion-MNIST and EfficientNet-Lite0; a small fake
# builder stands in for it here, so what is tested is the data module's handling of the first use)
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def first_use(tmp_path, monkeypatch):
    from lit_icl.icssl import build, features

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(build, "standin_missing", lambda: None)
    built = []

    def fake_build(out):
        built.append(out)
        _feature_file(out, classes=features.STANDIN_CLASSES, per_class=features.STANDIN_PER_CLASS,
                      dim=features.STANDIN_DIM)

    monkeypatch.setattr(build, "build_feature_standin", fake_build)
    return built


def test_the_default_missing_stand_in_is_checked_then_built_whole(tmp_path, first_use) -> None:
    from lit_icl.icssl.features import STANDIN_DIM, STANDIN_FILE

    dm = _dm(STANDIN_FILE, per_class=50)
    assert dm.builds_standin() and dm.ambient_dim == STANDIN_DIM
    dm.check_config()
    assert not first_use and not (tmp_path / "data").exists(), "the checks build and write nothing"
    with pytest.raises(ConfigError, match="a class has only 90 images in a split, fewer than per_class=100"):
        _dm(STANDIN_FILE, per_class=100).check_config()  # 300 images per class, 30 % held out
    dm.prepare_data()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["features_standin.pt"]  # no .partial left
    assert first_use[0].name == ".features_standin.pt.partial"
    assert not dm.builds_standin() and dm.ambient_dim == STANDIN_DIM
    assert dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)["x"].shape[-2:] == (100, STANDIN_DIM)


def test_runs_that_start_at_once_build_the_stand_in_once(tmp_path, first_use, monkeypatch) -> None:
    """Two data modules preparing the missing stand-in at the same time (a grid's ``--jobs 2`` on a fresh machine):
    one builds it, the other waits and uses it. Before the lock the second one deleted the first one's half-built
    stand-in and built its own."""
    import threading
    import time

    from lit_icl.icssl import build
    from lit_icl.icssl.features import STANDIN_FILE

    fake_build = build.build_feature_standin

    def slow_build(out):
        time.sleep(0.5)
        fake_build(out)

    monkeypatch.setattr(build, "build_feature_standin", slow_build)
    modules = [_dm(STANDIN_FILE, per_class=50) for _ in range(2)]
    errors = []

    def prepare(dm):
        try:
            dm.prepare_data()
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=prepare, args=(dm,)) for dm in modules]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(first_use) == 1
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["features_standin.pt"]
    assert all(not dm.builds_standin() for dm in modules)


def test_only_the_stand_ins_own_path_is_built_and_a_missing_build_names_its_packages(tmp_path, first_use,
                                                                                      monkeypatch) -> None:
    from lit_icl.icssl import build, features

    mistyped = _dm("data/my_features.pt")
    assert not mistyped.builds_standin()
    with pytest.raises(ConfigError, match="no feature file at data/my_features.pt"):
        mistyped.check_config()
    assert not _dm(features.STANDIN_FILE, build_standin=False).builds_standin()
    monkeypatch.setattr(build, "standin_missing", lambda: "Fashion-MNIST at /nowhere")
    with pytest.raises(ConfigError, match=r"needs Fashion-MNIST at /nowhere: `apt-get install dataset-fashion-mnist` "
                                          r"and `pip install -e '\.\[standins\]'`"):
        _dm(features.STANDIN_FILE).check_config()
    assert not first_use

"""IC-SSL on image features (Sec. 4.2): the feature-file episodes, the ImageFolder reader, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.icssl import ICSSLModule
from lit_icl.icssl.features import FeatureEpisodeDataModule, embed_images, load_features, read_image_folder


def _feature_file(path, classes: int = 4, per_class: int = 20, dim: int = 6) -> dict:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(classes).repeat_interleave(per_class)
    feats = torch.randn(classes * per_class, dim, generator=g) + 3 * torch.eye(classes, dim)[labels]
    data = {"features": feats, "labels": labels, "classes": [f"c{c}" for c in range(classes)]}
    torch.save(data, path)
    return data


def _dm(path, **kw) -> FeatureEpisodeDataModule:
    args = dict(features=str(path), per_class=5, train_episodes=3, val_episodes=4, test_episodes=4,
                test_fraction=0.3, normalize="none", feature_scale=1.0, batch_size=2, eval_batch_size=4,
                train_batches_per_epoch=3, train_label_ratio=(0.2, 0.5), eval_label_ratios=[0.2])
    args.update(kw)
    return FeatureEpisodeDataModule(**args)


def test_episodes_hold_two_classes_of_unseen_images(tmp_path) -> None:
    data = _feature_file(tmp_path / "f.pt")
    dm = _dm(tmp_path / "f.pt")
    train_rows, test_rows = set(), set()
    for loader, rows in ((dm.train_dataloader(), train_rows), (dm.test_dataloader(), test_rows)):
        for batch in loader:
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
    torch.testing.assert_close(ds[1]["x"], ds[1 + 3]["x"])  # the next epoch revisits the same episodes
    assert not torch.equal(ds[0]["x"], ds[1]["x"])


def test_missing_or_small_feature_files_are_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="python -m lit_icl.icssl.features standin --out"):
        load_features(tmp_path / "none.pt")
    _feature_file(tmp_path / "f.pt", per_class=6)
    with pytest.raises(ConfigError, match="fewer than per_class=5"):
        _dm(tmp_path / "f.pt").check_config()


def test_image_folder_reader_and_pooling(tmp_path) -> None:
    for c, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        (tmp_path / f"class{c}").mkdir()
        for i in range(3):
            Image.new("RGB", (20, 12), colour).save(tmp_path / f"class{c}" / f"{i}.png")
    images, labels, classes = read_image_folder(tmp_path, size=8, per_class=2)
    assert images.shape == (4, 3, 8, 8) and labels.tolist() == [0, 0, 1, 1] and classes == ["class0", "class1"]
    red = (1.0 - 0.485) / 0.229
    assert images[0, 0].allclose(torch.full((8, 8), red), atol=1e-5)
    feats = embed_images(torch.nn.Conv2d(3, 5, 3), images, batch_size=3)
    assert feats.shape == (4, 5) and torch.equal(feats[0], feats[1])


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
    main(["test", *args, "--ckpt_path", str(ckpt)])
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


def test_dataset_size_sweep_finds_the_largest_rise(tmp_path, capsys) -> None:
    """Fig. 3's sweep from results files: curves per method and the size after the steepest accuracy rise."""
    from lit_icl.core.results import result_row, write_results
    from lit_icl.icssl.sweep import main as sweep_main
    from lit_icl.icssl.sweep import phase_transition

    # A baseline with a jump between 1000 and 1200 episodes, our model rising smoothly; two seeds each.
    acc = {"Transformer": {200: 0.52, 1000: 0.55, 1200: 0.80, 5000: 0.85},
           "ORIG+E2E-ICL": {200: 0.70, 1000: 0.76, 1200: 0.78, 5000: 0.84}}
    runs = []
    for method, curve in acc.items():
        for size, value in curve.items():
            for seed in (0, 1):
                run = tmp_path / f"{method}-{size}-{seed}"
                rows = [result_row("accuracy", value + 0.01 * seed, method=method, label_ratio=0.03,
                                   n_labeled=3, dataset_size=size),
                        result_row("separation", value - 0.5, method=method, embeddings="model", k=10)]
                write_results(run, rows, {"seed": seed})
                runs.append(str(run))
    assert sweep_main([*runs, "--out", str(tmp_path / "sweep")]) == 0
    out = json.loads((tmp_path / "sweep/results.json").read_text())["rows"]
    transitions = {r["method"]: r["value"] for r in out if r["metric"] == "phase_transition"}
    assert transitions == {"Transformer": 1200, "ORIG+E2E-ICL": 1000}
    sep = [r for r in out if r["metric"] == "separation" and r["method"] == "Transformer"]
    assert [r["dataset_size"] for r in sep] == [200, 1000, 1200, 5000]
    assert sep[2]["value"] == pytest.approx(0.30) and sep[2]["n"] == 2
    assert (tmp_path / "sweep/sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "| Transformer | accuracy |" in capsys.readouterr().out
    assert phase_transition([(5, 0.1, 0.0, 1)]) is None
    assert phase_transition([(5, 0.6, 0.0, 1), (50, 0.6, 0.0, 1), (500, 0.5, 0.0, 1)]) is None  # never rises


# ----------------------------------------------------------------------------------------------------------
# The stand-in built on first use (the real build needs Fashion-MNIST and EfficientNet-Lite0; a small fake
# builder stands in for it here, so what is tested is the data module's handling of the first use)
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def first_use(tmp_path, monkeypatch):
    from lit_icl.icssl import features

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(features, "standin_missing", lambda: None)
    built = []

    def fake_build(out):
        built.append(out)
        _feature_file(out, classes=features.STANDIN_CLASSES, per_class=features.STANDIN_PER_CLASS,
                      dim=features.STANDIN_DIM)

    monkeypatch.setattr(features, "build_standin", fake_build)
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
    assert next(iter(dm.train_dataloader()))["x"].shape[-2:] == (100, STANDIN_DIM)


def test_only_the_stand_ins_own_path_is_built_and_a_missing_build_names_its_packages(tmp_path, first_use,
                                                                                      monkeypatch) -> None:
    from lit_icl.icssl import features

    mistyped = _dm("data/my_features.pt")
    assert not mistyped.builds_standin()
    with pytest.raises(ConfigError, match="no feature file at data/my_features.pt"):
        mistyped.check_config()
    assert not _dm(features.STANDIN_FILE, build_standin=False).builds_standin()
    monkeypatch.setattr(features, "standin_missing", lambda: "Fashion-MNIST at /nowhere")
    with pytest.raises(ConfigError, match=r"needs Fashion-MNIST at /nowhere: `apt-get install dataset-fashion-mnist` "
                                          r"and `pip install -e '\.\[standins\]'`"):
        _dm(features.STANDIN_FILE).check_config()
    assert not first_use


def test_what_the_build_lacks_is_named(tmp_path) -> None:
    from lit_icl.icssl.features import standin_missing

    assert standin_missing(tmp_path).startswith(f"Fashion-MNIST at {tmp_path}")

"""CoQE through the CLI on a tiny Omniglot-layout fixture: fit + test, results rows, figures, bad input."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from badinput import assert_rejected
from conftest import tb_scalars
from coqe.omniglot.helpers import BASE, SHIPPED, TRANSFORMER, coqe_args, write_omniglot_fixture
from lightning.pytorch import LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI, main
from lit_icl.coqe import CoQEClassificationModule


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """``images(tmp_path)``: copies the tiny image folder ``coqe_args`` would write into ``tmp_path`` (written once
    here, copied in about half the time it takes to write: most tests of this file are one CLI call). Returns
    ``tmp_path``."""
    template = write_omniglot_fixture(tmp_path_factory.mktemp("images") / "omniglot-py")

    def copy(tmp_path: Path) -> Path:
        shutil.copytree(template, tmp_path / "omniglot-py")
        return tmp_path

    return copy


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``fitted(tmp_path, config)``: puts into ``tmp_path`` a copy of the tiny run of ``coqe_args`` on ``config``
    (its image folder and ``runs/tiny/version_0``), which is fitted once, at the first test that asks; each test
    writes into its own copy only. Returns ``tmp_path``."""
    roots: dict[str | tuple[str, ...], Path] = {}

    def fit(tmp_path: Path, config: str | tuple[str, ...] = BASE) -> Path:
        if config not in roots:
            root = tmp_path_factory.mktemp("fitted")
            main(["fit", *coqe_args(root, config=config)])
            roots[config] = root
        shutil.copytree(roots[config], tmp_path, dirs_exist_ok=True)
        return tmp_path

    return fit


@pytest.fixture(scope="module")
def tested(fitted, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, LitICLCLI]]:
    """``tested(config)``: a copy of the tiny run of ``config`` (from ``fitted``) and the ``LitICLCLI`` (``run=False``)
    whose ``trainer.test`` scored its last checkpoint in-process, once per config; the tests only read the CLI's
    model, data module and rows (the test writes into that copy's run folder, no test's own)."""
    done: dict[str | tuple[str, ...], tuple[Path, LitICLCLI]] = {}

    def test(config: str | tuple[str, ...] = BASE) -> tuple[Path, LitICLCLI]:
        if config not in done:
            root = fitted(tmp_path_factory.mktemp("tested"), config)
            ckpt = root / "runs/tiny/version_0/checkpoints/last.ckpt"
            cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=coqe_args(root, config=config))
            cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path=str(ckpt))
            done[config] = root, cli
        return done[config]

    return test


@pytest.mark.parametrize(
    ("config", "method"), [(BASE, "coqe"), (TRANSFORMER, "transformer")]
)
def test_fit_then_test_gives_icl_iwl_curves_rows_and_figure(tmp_path, fitted, tested, config, method: str) -> None:
    fitted(tmp_path, config)
    run = tmp_path / "runs/tiny/version_0"
    scalars = tb_scalars(run)
    for tag in ("val/acc/icl", "val/acc/iwl") + (("val/acc/iwl_static",) if method == "coqe" else ()):
        assert len(scalars[tag]) == 2 and all(0.0 <= v <= 1.0 for v in scalars[tag]), tag  # one per epoch
    assert ("val/acc/iwl_static" in scalars) == (method == "coqe")
    assert len(scalars["val/iwl_context_wins"]) == 2
    assert ("train/loss_mod" in scalars) == (method == "coqe")
    assert ("train/noise_mean" in scalars) == (method == "coqe")
    ckpt = run / "checkpoints/last.ckpt"
    # The checkpoint alone rebuilds the trained model outside the CLI (net class and size from the config).
    loaded = CoQEClassificationModule.load_from_checkpoint(ckpt, map_location="cpu")
    assert loaded.method == method and loaded.data_source == "omniglot"
    assert "n_classes: null" in (run / "hparams.yaml").read_text() and loaded.net.n_classes == 20  # from the data
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
    _, cli = tested(config)  # the in-process test of the same run's last checkpoint, shared with the next test
    rows = [r for r in cli.model.test_rows if r["metric"] == "accuracy"]
    assert [r["evaluator"] for r in rows] == ["icl", "iwl"] + (["iwl_static"] if method == "coqe" else [])
    (params,) = [r for r in cli.model.test_rows if r["metric"] == "parameters"]
    assert params["value"] == sum(p.numel() for p in cli.model.net.parameters())
    for r in rows:
        assert r["metric"] == "accuracy" and r["split"] == "test" and r["method"] == method
        assert r["source"] == "omniglot" and r["p_bursty"] == 0.9 and r["zipf_alpha"] == 1.0
        assert 0.0 <= r["value"] <= 1.0 and (r["value"] * 16) == round(r["value"] * 16)  # 16 test sequences
    assert ("noise_mean0" in rows[0]) == (method == "coqe")
    figures = cli.model.test_figures(rows)
    assert list(figures) == ["icl_vs_iwl"]
    ax = figures["icl_vs_iwl"].axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([r["value"] for r in rows])
    # Through the CLI, the shared writer puts the rows and the figure into the test run's folder.
    main(["test", *coqe_args(tmp_path, config=config), "--ckpt_path", str(ckpt)])
    out = max((tmp_path / "runs/tiny").iterdir())
    result = json.loads((out / "results.json").read_text())
    assert [r["value"] for r in result["rows"] if r["metric"] == "accuracy"] == pytest.approx([r["value"] for r in rows])
    assert result["meta"]["trained_steps"] == 4
    assert (out / "icl_vs_iwl.png").read_bytes()[:4] == b"\x89PNG"


def test_test_accuracy_matches_an_independent_evaluation(tested) -> None:
    """The logged test accuracy equals a hand loop over the evaluators' batches with the trained net."""
    _, cli = tested()
    model, dm = cli.model.eval(), cli.datamodule
    rows = {r["evaluator"]: r["value"] for r in cli.model.test_rows if r["metric"] == "accuracy"}
    hits: dict[str, list[torch.Tensor]] = {"icl": [], "iwl": [], "iwl_static": []}
    for name, loader in zip(("icl", "iwl"), dm.test_dataloader()):
        for batch in loader:
            batch = dm.on_after_batch_transfer(batch, 0)
            with torch.no_grad():
                out = model.net(batch["images"], batch["labels"][:, :-1])
            y = batch["labels"][:, -1]
            if name == "icl":
                hits["icl"].append(out.logits[:, -1, :2].argmax(-1) == y)
            else:
                hits["iwl"].append(out.logits[:, -1].argmax(-1) == y)
                hits["iwl_static"].append(out.static_logits[:, -1].argmax(-1) == y)
    assert set(rows) == set(hits)
    for name, h in hits.items():
        assert torch.cat(h).float().mean().item() == pytest.approx(rows[name]), name
    # iwl_context_wins: IWL queries answered with a label shown in their context, counted by hand.
    wins = []
    for batch in dm.test_dataloader()[1]:
        batch = dm.on_after_batch_transfer(batch, 1)
        with torch.no_grad():
            pred = model.net(batch["images"], batch["labels"][:, :-1]).logits[:, -1].argmax(-1)
        wins += [int(p) in set(ctx.tolist()) for p, ctx in zip(pred, batch["labels"][:, :-1])]
    (row,) = [r for r in cli.model.test_rows if r["metric"] == "iwl_context_wins"]
    assert row["value"] == pytest.approx(sum(wins) / len(wins))


def test_noise_reaches_the_net_in_training_only(tmp_path) -> None:
    """Training steps pass the scheduled noise; validation and test pass none."""
    # One epoch (2 training steps, a validation round, then the test) has every kind of forward the check tells apart.
    cli = LitICLCLI(LightningModule, LightningDataModule,
                    run=False, args=coqe_args(tmp_path, "--trainer.max_epochs", "1"))
    seen: list[tuple[bool, bool]] = []  # (net in training mode, noise given)
    net = cli.model.net
    forward = net.forward

    def spy(images, labels, noise=None):
        seen.append((net.training, noise is not None))
        if noise is not None:
            assert noise.shape == (images.shape[0], net.n_classes) and noise.mean() > 3.0  # N(5, 1)
        return forward(images, labels, noise)

    net.forward = spy
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.trainer.test(cli.model, datamodule=cli.datamodule)
    assert (True, True) in seen and (False, False) in seen
    assert all(train == noisy for train, noisy in seen)


C = BASE
T = TRANSFORMER
M = "--model.init_args."
N = "--model.init_args.net.init_args."
D = "--data.init_args."

#: (config, extra args, needle): every row fails while parsing, constructing or binding model to data.
COQE_ROWS: list[tuple[str | tuple[str, ...], list[str], str]] = [
    # --- parser
    (C, [D + "source", "mnist"], "source"),
    (C, [N + "context_logit", "mix"], "context_logit"),
    (C, [M + "lr_schedule", "cosine"], "lr_schedule"),
    (C, [N + "no_such_key", "1"], "no_such_key"),
    # --- OmniglotSequenceDataModule
    (C, [D + "p_bursty", "1.5"], "p_bursty=1.5 must lie in [0, 1]"),
    (C, [D + "folder", "/no/such/omniglot"], "put torchvision's Omniglot folder"),
    (C, [D + "source", "auto", D + "folder", "/no/such/omniglot"], "no images_background/ or images_evaluation/ there"),
    (C, [D + "batch_size", "6"], "batch_size=6 must be a positive multiple of chunk_size=4"),
    (C, [D + "test_sequences", "0"], "test_sequences=0"),
    # a size no machine holds: failed at the first batch, after the run folder existed, with a traceback
    (C, [D + "batch_size", "1000000000000"], ("far too large for this machine: one training batch would need "
     "8583068.8 GiB (batch_size=1000000000000 sequences of 9 images of 16x16 pixels)")),
    (C, [D + "image_size", "4"], "image_size=4"),
    (C, [D + "n_holdout", "1"], "at least 2 holdout classes"),
    (C, [D + "augment", "true"], ("n_holdout=4 must be a multiple of 8 with augment: true (a character's 8 "
                                  "rotations and flips are held out together); use --data.init_args.n_holdout 8")),
    (C, [D + "n_common", "100"], "n_common=100 leaves fewer than 2 rare classes (24 classes, 4 holdout); use at most 18"),
    (C, [D + "n_common", "-1"], "n_common=-1 must be >= 0"),
    (C, [D + "n_holdout", "30"], "n_holdout=30 leaves fewer than 2 training classes of the 24 classes; use at most 22"),
    (C, [D + "max_classes", "5"], ("n_holdout=4 leaves fewer than 2 training classes of the 5 classes; use at most 3 "
                                  "holdout classes, or more classes (max_classes)")),
    (C, [D + "zipf_alpha", "-0.5"], "zipf_alpha=-0.5 must be >= 0"),
    (C, [D + "num_workers", "-1"], "num_workers=-1"),
    # --- CoQEClassificationModule
    (C, [M + "lr", "-1"], "lr=-1"),
    (C, [M + "warmup_steps", "0"], "warmup_steps=0"),
    (C, [M + "noise.interval", "0"], "noise.interval=0"),
    (C, [M + "noise.std0", "-1"], "noise.std0=-1"),
    (C, [M + "noise.delay", "-3"], "noise.delay=-3"),
    (C, [M + "noise.interval", "0.5"], "noise.interval"),  # a type error from the parser
    (C, [M + "noise_mean0", "3"], "noise_mean0"),  # the loose name of older code
    # --- nets
    (C, [N + "resnet_channels", "[8, 8, 8]"], "resnet_channels=[8, 8, 8] must be 4 integers"),
    # jsonargparse loses a null two classes deep on the command line; the line gives the form that keeps it
    (C, [N + "resnet_channels", "null"], ("a null this deep is lost on the command line, so give it through the "
                                          "class above it: --model.init_args.net '{\"init_args\": "
                                          "{\"resnet_channels\": null}}'")),
    (C, [N + "heads", "3"], "not divisible by heads=3"),
    (C, [N + "depth", "0"], "depth=0"),
    # resnet_channels (set by coqe_args) overrides emb_dim, which is still checked
    (C, [N + "emb_dim", "0"], "emb_dim=0 must be >= 1; one of [64, 256, 512]"),
    (T, [N + "emb_dim", "-64"], "emb_dim=-64 must be >= 1"),
    (C, [N + "noise_k", "50"], "noise_k=50 exceeds n_classes=20"),
    (C, [N + "noise_on", "context"], "noise_on"),
    (C, [N + "stem_channels", "0"], "stem_channels=0"),
    (C, [N + "max_time", "0"], "max_time=0"),  # would make NaN positional encodings
    (C, [N + "channels_last", "maybe"], "channels_last"),
    (C, [D + "max_classes", "0"], "max_classes=0 must be a positive integer"),
    (C, [D + "max_classes", "500"], "max_classes=500 exceeds the 24 classes"),
    (T, [N + "heads", "5"], "not divisible by heads=5"),
    # --- model vs data (bind_datamodule, before any run folder)
    (C, [N + "n_classes", "1613"], "set model.init_args.net.init_args.n_classes: 20"),
    (T, [N + "n_classes", "19"], "set model.init_args.net.init_args.n_classes: 20"),
    # --- trainer vs net vs data: the fixture's 16x16 images reach the last group's strided conv at 1x1
    (C, ["--trainer.precision", "bf16-mixed"], "image_size=16 feeds 1x1 feature maps"),
]


def test_a_channels_last_run_tests_through_the_shared_writer_and_reloads_in_its_layout(tmp_path) -> None:
    """``channels_last`` is a net setting: the checkpoint rebuilds the net in that layout with the trained weights,
    and a test run writes its rows through the shared writer."""
    args = coqe_args(tmp_path, "--trainer.max_epochs", "1", "--model.init_args.net.init_args.channels_last", "true")
    main(["fit", *args])
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    loaded = CoQEClassificationModule.load_from_checkpoint(ckpt, map_location="cpu")
    resnet = loaded.net.embed.resnet
    assert resnet.channels_last and resnet.groups[0].conv2.weight.is_contiguous(memory_format=torch.channels_last)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
    main(["test", *args, "--ckpt_path", str(ckpt)])
    rows = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["rows"]
    assert {r["evaluator"] for r in rows if r["metric"] == "accuracy"} == {"icl", "iwl", "iwl_static"}


@pytest.mark.parametrize(("config", "extra", "needle"), COQE_ROWS)
def test_bad_input_fails_early_with_one_line(tmp_path, capsys, images, config, extra: list[str], needle: str) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *coqe_args(images(tmp_path), config=config), *extra], needle)


def test_the_null_the_refusal_advises_reaches_the_net_and_keeps_its_other_options(tmp_path, capsys, images) -> None:
    """The form the nested-null refusal gives: ``resnet_channels`` back to None, the net's other settings kept."""
    with pytest.raises(SystemExit) as done:
        main(["fit", *coqe_args(images(tmp_path)), "--model.init_args.net", '{"init_args": {"resnet_channels": null}}',
              "--print_config"])
    assert done.value.code == 0
    net = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["net"]
    assert net["class_path"] == "lit_icl.coqe.CoQEClassifier" and net["init_args"]["resnet_channels"] is None
    assert net["init_args"]["depth"] == 1  # coqe_args sets it on the command line before the advised form


@pytest.mark.parametrize("damage", ["truncate", "empty", "text"])
def test_an_unreadable_image_is_one_line_naming_it(tmp_path, capsys, images, damage: str) -> None:
    args = coqe_args(images(tmp_path))  # the fixture folder, a copy of this test's own
    png = sorted((tmp_path / "omniglot-py").rglob("*.png"))[5]
    data = png.read_bytes()
    png.write_bytes({"truncate": data[: len(data) // 2], "empty": b"", "text": b"not an image"}[damage])
    line = assert_rejected(tmp_path, capsys, ["fit", *args], "cannot read image")
    assert str(png) in line


@pytest.mark.parametrize("config", SHIPPED, ids=lambda c: "+".join(Path(p).stem for p in c))
def test_every_shipped_config_trains_on_the_tiny_fixture(tmp_path, images, config: tuple[str, ...]) -> None:
    """The base and each overlay on it (Table 1 / Table 2 / baseline / CPU scale) parse and train (net shrunk,
    everything else as shipped)."""
    assert len(SHIPPED) >= 10
    text = "".join(Path(p).read_text() for p in config)
    extra = ["--trainer.max_steps", "2", "--data.init_args.train_batches_per_epoch", "2"]
    if "noise_k" in text:
        extra += ["--model.init_args.net.init_args.noise_k", "10"]  # 1500 > the fixture's 20 classes
    if "max_classes" in text:
        extra += ["--data.init_args.max_classes", "null"]  # the CPU configs' 400 > the fixture's 24 classes
    main(["fit", *coqe_args(images(tmp_path), *extra, config=config)])
    ckpt = torch.load(tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2


def test_bf16_mixed_trains_coqe_with_finite_losses(tmp_path) -> None:
    # 28x28 images, as cpu.yaml: the fixture's 16x16 are refused in bf16 on a CPU (ResNetEmbedder.check_config).
    main(["fit", *coqe_args(tmp_path, "--trainer.precision", "bf16-mixed", "--data.init_args.image_size", "28")])
    scalars = tb_scalars(tmp_path / "runs/tiny/version_0")
    for tag in ("train/loss", "train/loss_mod", "train/loss_orig"):
        assert scalars[tag] and all(torch.isfinite(torch.tensor(scalars[tag]))), tag
    assert 0.0 <= scalars["val/acc/icl"][-1] <= 1.0


def _final_state(root: Path) -> dict:
    return torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)


def _six_steps(root: Path, *extra: str) -> list[str]:
    """A six-step run of three-batch epochs logging under ``root``."""
    return coqe_args(root, "--trainer.max_steps", "6", "--data.init_args.train_batches_per_epoch", "3",
                     "--trainer.log_every_n_steps", "50", *extra)


@pytest.fixture(scope="module")
def uncut(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The last checkpoint of the six-step run that was not cut, fitted once for both ways of cutting below (when
    step checkpoints are saved changes no number the run trains)."""
    root = tmp_path_factory.mktemp("uncut")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(Path(__file__).resolve().parents[3])  # the configs' paths are relative to the repository
        main(["fit", *_six_steps(root)])
    return _final_state(root)


@pytest.mark.parametrize(
    ("cut", "step", "checkpoint_every"),
    [("StopAtStep", 4, None),  # stopped after step 4 the way --trainer.max_time stops a run
     ("FailAtStep", 5, "2")],  # crashed after step 5, its last checkpoint saved inside an epoch at step 4
)
def test_a_run_resumed_inside_an_epoch_ends_bit_identical(
    tmp_path, uncut: dict, cut: str, step: int, checkpoint_every: str | None
) -> None:
    """Six steps of three-batch epochs, cut inside epoch 1 with a checkpoint at step 4, resumed with
    ``--ckpt_path last``: the weights and optimizer state of the run that was not cut. Without the training
    loader's saved position the resumed run skips the rest of epoch 1 (stopped) or trains on its first batch
    again (crashed)."""
    every = ["--checkpoint.every_n_train_steps", checkpoint_every] if checkpoint_every else []
    callback = f'[{{"class_path": "subprocess_callbacks.{cut}", "init_args": {{"step": {step}}}}}]'
    if cut == "FailAtStep":
        with pytest.raises((RuntimeError, SystemExit)):
            main(["fit", *_six_steps(tmp_path, *every, "--trainer.callbacks", callback)])
    else:
        main(["fit", *_six_steps(tmp_path, *every, "--trainer.callbacks", callback)])
    at_cut = _final_state(tmp_path)
    assert at_cut["global_step"] == 4
    assert at_cut["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 1}]
    main(["fit", *_six_steps(tmp_path, *every), "--ckpt_path", "last"])
    resumed = _final_state(tmp_path)
    assert uncut["global_step"] == resumed["global_step"] == 6
    assert all(torch.equal(uncut["state_dict"][k], resumed["state_dict"][k]) for k in uncut["state_dict"])
    for a, b in zip(uncut["optimizer_states"][0]["state"].values(), resumed["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_whose_root_holds_the_other_source_is_refused_and_a_moved_root_resumes(tmp_path, capsys) -> None:
    """``source: auto`` picks Omniglot or the glyphs stand-in by what ``root`` holds, and ``root`` may change on
    resume (data moves). A resumed fit whose ``root`` holds the other source has arguments equal to the run's but
    would train on other images, so it is refused in one line; the same images at a new ``root`` resume."""
    from coqe.omniglot.helpers import write_omniglot_fixture

    first, moved, other = tmp_path / "first", tmp_path / "moved", tmp_path / "other"
    write_omniglot_fixture(first / "omniglot-py")
    write_omniglot_fixture(other / "glyphs")  # the stand-in's folder, in the same layout
    args = [*coqe_args(tmp_path), "--data.init_args.source", "auto", "--data.init_args.folder", "null"]
    main(["fit", *args, "--data.init_args.root", str(first)])
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["OmniglotSequenceDataModule"] == {
        "source": "omniglot"}
    resume = ["fit", *args, "--ckpt_path", "last", "--trainer.max_steps", "6"]
    line = assert_rejected(tmp_path, capsys, [*resume, "--data.init_args.root", str(other)],
                           "was trained with data source 'omniglot'", runs_exist=True)
    assert line.endswith(f"resolve it to 'glyphs' (found {other / 'glyphs'}), which a resumed run cannot change; "
                         "resume with --data.init_args.source omniglot and the location of that data, or start a "
                         "new run without --ckpt_path")
    first.rename(moved)
    main([*resume, "--data.init_args.root", str(moved)])
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 6


def test_a_test_on_data_with_another_class_count_is_one_line_and_writes_nothing(tmp_path, capsys, fitted) -> None:
    """The net takes its class count from the data's training classes, not from a setting the checkpoint records:
    a test with 2 more holdout classes built a net of 18 classes for 20-class weights, and Lightning failed to load
    them with a state_dict traceback (status 1) after the test's run folder existed."""
    fitted(tmp_path)
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    line = assert_rejected(tmp_path, capsys, ["test", *coqe_args(tmp_path, "--data.init_args.n_holdout", "6"),
                                              "--ckpt_path", str(ckpt)], "does not fit", runs_exist=True)
    assert line == (
        f"lit_icl: error: --ckpt_path {ckpt} does not fit the model this config builds: "
        "net.embed.label_embedding.weight is (20, 64) in the checkpoint but (18, 64) here (and 2 more); the model "
        "takes that size from its data settings (--data.init_args.n_holdout is 6 here but 4 in the checkpoint); use "
        f"the data settings it was trained with (--config {ckpt.parents[1] / 'config.yaml'}), or a checkpoint "
        "trained on this data")

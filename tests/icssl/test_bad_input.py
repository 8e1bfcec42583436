"""IC-SSL bad input through the CLI: one ``lit_icl: error:`` line, exit status 2, no run folder.

Table-driven: each row is ``(config files, extra CLI args, expected substring of the error line)``, added to
the tiny IC-SSL arguments of ``icssl.helpers.tiny_args`` and run through ``lit_icl.cli.main(["fit", ...])`` by
:func:`badinput.assert_rejected`. Every row fails while parsing or constructing, so the whole table takes
seconds. The paper-agnostic rows (parser, ``--ckpt_path``) are in ``tests/test_cli.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from badinput import assert_rejected
from icssl.helpers import MANIFOLDS, PRODUCT, overlay, tiny_args

ID = [MANIFOLDS]
OOD = overlay("manifolds", "ood")
M = "--model.init_args."
D = "--data.init_args."
REP = "--model.init_args.net.init_args.representation"
HEAD = "--model.init_args.net.init_args.head.init_args."
EIG = [REP, "lit_icl.icssl.LaplacianEigenmap"]
CB = "--trainer.callbacks"
#: The E2E eigenmap behind a learned projection; each row adds the projection's own arguments.
PROJ = [REP, "lit_icl.icssl.ProjectedRepresentation", REP + ".init_args.representation", "lit_icl.icssl.InContextEigenmap",
        REP + ".init_args.representation.init_args.n_points", "20"]
NET = "--model.init_args.net.init_args."
EIG_LR = overlay("manifolds", "eig_lr")
RBF_LR = overlay("manifolds", "rbf_lr")
TRANSFORMER = overlay("manifolds", "transformer")
IMAGES = ["configs/icssl/image_manifolds.yaml"]
FEATURES = ["configs/icssl/features.yaml"]


def _callback(init_args: str) -> list[str]:
    return [CB, f'[{{"class_path": "lit_icl.callbacks.RepresentationMetrics", "init_args": {init_args}}}]']


#: (config, extra args, needle). Grouped by the object whose argument is wrong.
ICSSL_ROWS: list[tuple[list[str], list[str], str]] = [
    # --- parser (jsonargparse): unknown keys, class paths, wrong types, condensed to one line
    (ID, [M + "no_such_key", "1"], "no_such_key"),
    (ID, [REP, "lit_icl.icssl.NoSuchNet"], "NoSuchNet"),
    (ID, [M + "lr_schedule", "linear"], "lr_schedule: Expected a typing.Literal['cosine', 'constant']"),
    (ID, [D + "train_label_ratio", "[0.1]"], "train_label_ratio: Expected a tuple with 2 elements"),
    (ID, [D + "n_points", "abc"], "n_points: Expected a <class 'int'>. Got value: abc"),
    # --- ICSSLModule
    (ID, [M + "lr", "0"], "lr=0.0 must be > 0"),
    (ID, [M + "lr", "-1"], "lr=-1.0 must be > 0"),
    (ID, [M + "weight_decay", "-0.1"], "weight_decay=-0.1 must be >= 0"),
    (ID, [M + "warmup_steps", "-5"], "warmup_steps=-5 must be >= 0"),
    (ID, [REP + ".init_args.n_points", "30"], "built for n_points=30 but the data has n_points=20"),
    # values shared by data and model live in the data module alone: the model has no label_ratios
    (ID, [M + "label_ratios", "[0.1, 0.3]"], "label_ratios"),
    # --- ManifoldDataModule
    (ID, [D + "eval_label_ratios", "[0.25, 1.2]"], "label ratio 1.2 is outside (0, 1)"),
    # sizes no machine holds: failed at the first batch, after the run folder existed, with a traceback
    (ID, [D + "batch_size", "1000000000000"], ("far too large for this machine: one training batch would need "
     "372529.0 GiB (batch_size=1000000000000 episodes of 20 points x 3 values)")),
    (IMAGES, [D + "image_size", "1000000"], "the frames would need"),
    (ID, [D + "eval_label_ratios", "[0.01]"], "leaves no labeled point"),
    (ID, [D + "eval_label_ratios", "[]"], "is empty"),
    (ID, [D + "eval_label_ratios", "[0.25, 0.25]"], "repeats 0.25"),
    (ID, [D + "train_manifolds", "[cylindr]"], "unknown manifold 'cylindr'"),
    (ID, [D + "train_manifolds", "[]"], "train_manifolds is empty"),
    (ID, [D + "val_manifolds", "[]"], "val_manifolds is empty"),
    (ID, [D + "test_manifolds", "[sphere*torus]"], "different ambient dimensions [3, 6]"),
    # one test set per test manifold: a repeated one would be tested twice, its rows under one name
    (ID, [D + "test_manifolds", "[cylinder, sphere, cylinder]"], "repeats 'cylinder', which test_per_manifold: true"),
    (ID, [D + "train_manifolds", "[cone, cone]", D + "test_manifolds", "null"], "train_manifolds=['cone', 'cone'] repeats 'cone'"),
    (ID, [D + "n_points", "0", REP + ".init_args.n_points", "0"], "n_points=0 must be >= 2"),
    (ID, [D + "chunk_size", "0"], "chunk_size=0 must be >= 1"),
    (ID, [D + "chunk_size", "-8"], "chunk_size=-8 must be >= 1"),
    (ID, [D + "batch_size", "12"], "batch_size=12 must be a positive multiple of chunk_size=8"),
    (ID, [D + "eval_batch_size", "0"], "eval_batch_size=0 must be a positive multiple of chunk_size=8"),
    (ID, [D + "val_episodes", "0"], "val_episodes=0 must be a positive multiple"),
    (ID, [D + "test_episodes", "20"], "test_episodes=20 must be a positive multiple"),
    (ID, [D + "train_batches_per_epoch", "0"], "train_batches_per_epoch=0 must be >= 1"),
    (ID, [D + "train_label_ratio", "[0.5, 0.1]"], "train_label_ratio=(0.5, 0.1) must be (low, high)"),
    (ID, [D + "pose_scale", "[0.1, 0.02]"], "pose_scale=(0.1, 0.02) must be (low, high)"),
    (ID, [D + "pose_scale", "[-1, 1]"], "pose_scale=(-1.0, 1.0): both ends must lie in (0, inf)"),
    (ID, [D + "pose_translation", "[1, -1]"], "pose_translation=(1.0, -1.0) must be (low, high)"),
    (ID, [D + "pose_rotation", "spin"], "pose_rotation: Expected a typing.Literal['planar', 'haar', 'none']"),
    (ID, [D + "cylinder_height", "0"], "cylinder_height=0.0 must be > 0"),
    (ID, [D + "cylinder_height", "-2"], "cylinder_height=-2.0 must be > 0"),
    ([PRODUCT], [D + "product_positive_fraction", "0"], "product_positive_fraction=0.0 must lie in (0, 1]"),
    (ID, [D + "product_positive_fraction", "1.5"], "product_positive_fraction=1.5 must lie in (0, 1]"),
    (ID, [D + "torus_tau", "0"], "torus_tau=0.0 must lie in (0, 4.44"),
    (ID, [D + "labeled_subset", "first"], "labeled_subset: Expected a typing.Literal['random', 'stratified']"),
    (ID, [D + "num_workers", "-1"], "num_workers=-1 must be >= 0"),
    (OOD, [D + "test_manifolds", "[]"], "test_manifolds is empty"),
    # --- InContextEigenmap (ORIG+E2E-ICL representation)
    (ID, [REP + ".init_args.n_components", "0"], "n_components=0 must lie in [1, n_points - 1 = 19]"),
    (ID, [REP + ".init_args.n_components", "20"], "n_components=20 must lie in [1, n_points - 1 = 19]"),
    (ID, [REP + ".init_args.lap_layers", "0"], "lap_layers=0 must be >= 1"),
    (ID, [REP + ".init_args.lap_bandwidths", "[]"], "bandwidths is empty"),
    (ID, [REP + ".init_args.lap_bandwidths", "[0.01, 0]"], "bandwidths must be a non-empty list of positive"),
    (ID, [REP + ".init_args.lap_output", "foo"], "lap_output: Expected a typing.Literal"),
    (ID, [REP + ".init_args.eig_layers", "0"], "eig_layers=0 must be >= 1"),
    (ID, [REP + ".init_args.eig_heads", "0"], "eig_heads=0 must be >= 1"),
    (ID, [REP + ".init_args.layer_repeats", "0"], "layer_repeats=0 must be >= 1"),
    (ID, [REP + ".init_args.stack_repeats", "0"], "stack_repeats=0 must be >= 1"),
    # --- LaplacianEigenmap (EIG baseline): its own ranges, and sizes against the data (check_config)
    (ID, [*EIG, REP + ".init_args.n_neighbors", "50"], "n_neighbors=50"),
    (ID, [*EIG, REP + ".init_args.n_neighbors", "0"], "n_neighbors=0 must be >= 1"),
    (ID, [*EIG, REP + ".init_args.n_components", "0"], "n_components=0 must be >= 1"),
    (ID, [*EIG, REP + ".init_args.n_components", "25"], "n_components=25 must lie in [1, 20]"),
    (ID, [*EIG, REP + ".init_args.rbf_scale", "0"], "rbf_scale=0.0 must be > 0"),
    (ID, [*EIG, REP + ".init_args.normalization", "foo"], "normalization: Expected a typing.Literal"),
    # --- GDICLHead
    (ID, [HEAD + "num_classes", "1"], "num_classes=1 must be >= 2"),
    (ID, [HEAD + "embed_dim", "0"], "embed_dim=0 must be >= 1"),
    (ID, [HEAD + "mlp_hidden", "0"], "mlp_hidden=0 must be >= 1"),
    (ID, [HEAD + "num_layers", "0"], "num_layers=0 must be >= 1"),
    (ID, [HEAD + "step_size", "0"], "step_size=0.0 must be > 0"),
    (ID, [HEAD + "gamma", "-1"], "gamma=-1.0 must be > 0"),
    (ID, [HEAD + "kernel", "poly"], "kernel: Expected a typing.Literal['rbf', 'linear']"),
    # --- RepresentationMetrics callback
    (ID, _callback('{"k": 0}'), "k=0 neighbours requested"),
    (ID, _callback('{"k": 25}'), "RepresentationMetrics k=25 but episodes have only 20 points"),
    (ID, _callback('{"pairs": [["model", "model"]]}'), "two different embedding names"),
    (ID, _callback('{"compare_checkpoints": {"other": "no/such.ckpt"}}'), "no checkpoint file at ['no/such.ckpt']"),
    (ID, _callback('{"compare_checkpoints": {"eig": "configs/icssl/manifolds.yaml"}}'),
     "compare_checkpoints names ['eig'] are taken"),
    # --- faithful-mode and ablation options of the representation
    (ID, [REP + ".init_args.lap_activation", "relu"], "lap_activation: Expected a typing.Literal['rbf', 'linear']"),
    (ID, [REP + ".init_args.eig_init", "lemma2"], "init='lemma2' is Lemma 2's construction"),
    (ID, [REP + ".init_args.eig_mu", "0"], "mu=0.0 must be > 0"),
    ([PRODUCT], [D + "product_permute_factors", "maybe"], "product_permute_factors: Expected a <class 'bool'>"),
    (OOD, [D + "test_per_manifold", "maybe"], "test_per_manifold: Expected a <class 'bool'>"),
    # --- baselines (their own configs)
    (EIG_LR, [HEAD + "l2", "0"], "l2=0.0 must be > 0"),
    (EIG_LR, [HEAD + "max_iter", "0"], "max_iter=0 must be >= 1"),
    (RBF_LR, [HEAD + "gamma", "-1"], "gamma=-1.0 must be > 0"),
    (TRANSFORMER, [NET + "d_model", "250"], "d_model=250 must be divisible by num_heads=4"),
    (TRANSFORMER, [NET + "dropout", "1.5"], "dropout=1.5 must lie in [0, 1)"),
    (TRANSFORMER, [NET + "input_dim", "5"], "input_dim=5 but the data's points have 3 coordinates"),
    # --- image-manifold and feature data (their own configs; nothing of the data needs to exist)
    (IMAGES, [D + "root", "no/such/folder"], "no image-manifold sequences under no/such/folder"),
    (IMAGES, [D + "val_sequences", "500"], "val_sequences=500 must be below train_sequences=500"),
    (IMAGES, [D + "pixel_scale", "0"], "pixel_scale=0.0 must be > 0"),
    (FEATURES, [D + "features", "no/such.pt"], "no feature file at no/such.pt"),
    (FEATURES, [D + "per_class", "0"], "per_class=0 must be >= 1"),
    (FEATURES, [D + "feature_scale", "0"], "feature_scale=0.0 must be > 0; 0 makes every point the origin"),
    (IMAGES, [D + "eval_label_ratios", "[]"], "eval_label_ratios is empty"),
    (IMAGES, [D + "eval_label_ratios", "[0.1, 0.1]"], "repeats 0.1"),
    # --- ProjectedRepresentation (configs/icssl/features/projected.yaml), on the tiny 3-D manifold episodes
    (ID, [*PROJ, REP + ".init_args.input_dim", "5"],
     "ProjectedRepresentation input_dim=5 but the data's points have 3 coordinates"),
    (ID, [*PROJ, REP + ".init_args.input_dim", "3", REP + ".init_args.dim", "0"], "dim=0 must be >= 1"),
    (ID, [*PROJ, REP + ".init_args.input_dim", "3", REP + ".init_args.scale", "-0.1"], "scale=-0.1 must be > 0"),
    (FEATURES, [D + "eval_label_ratios", "[]"], "eval_label_ratios is empty"),
    (FEATURES, [D + "eval_label_ratios", "[0.03, 0.03]"], "repeats 0.03"),
    (FEATURES, [D + "normalize", "pca"], "normalize: Expected a typing.Literal['l2', 'standard', 'none']"),
    (FEATURES, [D + "build_standin", "maybe"], "build_standin: Expected a <class 'bool'>"),
    (IMAGES, [D + "build_standin", "maybe"], "build_standin: Expected a <class 'bool'>"),
    # A missing path that is not the stand-in's own is an error, never a silent stand-in build.
    (IMAGES, [D + "root", "data/my_images"], "no image-manifold sequences under data/my_images"),
]


def _fit_args(tmp_path, config: list[str], extra: list[str]) -> list[str]:
    base = Path(config[0]).read_text()
    if "lit_icl.icssl.ManifoldDataModule" not in base:  # image / feature data: their config, no shrinking
        return ["fit", "--config", config[0], "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *extra]
    args = tiny_args(tmp_path, config=config)
    swaps_class = len(config) > 1 and "class_path" in Path(config[-1]).read_text()  # a baseline overlay
    if swaps_class or (extra[:1] == [REP] and "." in extra[1] and not extra[1].startswith("{")):
        # Swapping the representation class: drop the E2E representation's init args (flag + value pairs).
        flags = [i for i, a in enumerate(args) if "representation.init_args" in a]
        args = [a for i, a in enumerate(args) if i not in flags and i - 1 not in flags]
    return ["fit", *args, *extra]


@pytest.mark.parametrize(("config", "extra", "needle"), ICSSL_ROWS, ids=[r[2][:40] for r in ICSSL_ROWS])
def test_icssl_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, config, extra, needle) -> None:
    assert_rejected(tmp_path, capsys, _fit_args(tmp_path, config, extra), needle)


# ----------------------------------------------------------------------------------------------------------
# Broken data files: a feature file and image-manifold frames, written into tmp_path / "data"
# ----------------------------------------------------------------------------------------------------------
def _features(n: int = 80, dim: int = 6, classes: int = 4) -> dict:
    labels = torch.arange(classes).repeat_interleave(n // classes)
    return {"features": torch.randn(n, dim, generator=torch.Generator().manual_seed(0)), "labels": labels}


def _with(**changes) -> dict:
    return {**_features(), **changes}


def _nan_rows() -> dict:
    data = _features()
    data["features"][[3, 40]] = float("nan")
    return data


def _truncated(path: Path) -> None:
    torch.save(_features(), path)
    path.write_bytes(path.read_bytes()[:300])


#: (how the feature file is written, needle of the one error line).
BAD_FEATURE_FILES: list[tuple[Callable[[Path], object], str]] = [
    (lambda p: p.write_bytes(b""), "is empty"),
    (_truncated, "truncated or not a torch.save file: RuntimeError"),
    (lambda p: p.write_text("features,labels\n1,0\n"), "truncated or not a torch.save file"),
    (lambda p: torch.save({"features": np.zeros((8, 2)), "labels": np.zeros(8)}, p), "(numpy arrays?)"),
    (lambda p: torch.save([torch.zeros(8, 2)], p), "it holds list, not a dict"),
    (lambda p: torch.save({"features": torch.zeros(8, 2)}, p), "it holds ['features'], not a dict"),
    (lambda p: torch.save(_with(labels=[0, 1] * 40), p), "'labels' list, not a dict"),
    (lambda p: torch.save(_with(features=torch.zeros(80)), p), "'features' (80,) and 'labels' (80,), not matching"),
    (lambda p: torch.save(_with(labels=torch.zeros(79, dtype=torch.long)), p), "'labels' (79,), not matching"),
    (lambda p: torch.save({"features": torch.zeros(0, 6), "labels": torch.zeros(0)}, p), "not matching non-empty"),
    (lambda p: torch.save(_nan_rows(), p), "2 of 80 feature rows hold NaN or inf (first: row 3)"),
    (lambda p: torch.save(_with(features=_features()["features"].index_fill(0, torch.tensor([7]), float("inf"))), p),
     "1 of 80 feature rows hold NaN or inf (first: row 7)"),
    (lambda p: torch.save(_with(labels=torch.full((80,), 0.5)), p), "'labels' must be integer class ids"),
    (lambda p: torch.save(_with(features=torch.zeros(80, 6, dtype=torch.complex64)), p), "must be real numbers"),
]


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


@pytest.mark.parametrize(("write", "needle"), BAD_FEATURE_FILES, ids=[r[1][:40] for r in BAD_FEATURE_FILES])
def test_a_broken_feature_file_is_one_line_naming_it(tmp_path, capsys, write, needle) -> None:
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "features.pt"
    write(path)
    before = _files(tmp_path)
    line = assert_rejected(tmp_path, capsys, _fit_args(tmp_path, FEATURES, [D + "features", str(path)]), needle)
    assert str(path) in line
    assert _files(tmp_path) == before, "nothing written anywhere"


def test_a_feature_batch_beyond_memory_is_refused_before_the_run(tmp_path, capsys) -> None:
    """The points' dimension comes from the feature file, so the size is checked once the file is read (before the
    run): 1e12 episodes of 6 points x 6 features are 1e12 x 6 x (6 x 4 + 8) bytes."""
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "features.pt"
    torch.save(_features(), path)
    extra = [D + "features", str(path), D + "per_class", "3", REP + ".init_args.n_points", "6",
             D + "eval_label_ratios", "[0.25, 0.5]", D + "train_label_ratio", "[0.25, 0.5]",
             D + "batch_size", "1000000000000"]
    assert_rejected(tmp_path, capsys, _fit_args(tmp_path, FEATURES, extra),
                    ("far too large for this machine: one training batch would need 178813.9 GiB "
                     "(batch_size=1000000000000 episodes of 6 points x 6 values)"))

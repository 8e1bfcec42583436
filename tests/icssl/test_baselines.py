"""IC-SSL baselines (Sec. 4.1, App. F.7, App. G): solvers against independent optimisers, the Transformer
baseline's size and equivariances, and the baselines behind the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from badinput import assert_rejected
from conftest import quiet_run_args
from icssl.helpers import overlay, tiny_args

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import count_parameters
from lit_icl.icssl.module import ICSSLModule
from lit_icl.icssl.nets import LaplacianEigenmap, RawCoordinates, SemiSupervisedICL
from lit_icl.icssl.nets.baselines import (
    ICLTransformerBaseline,
    KernelLogisticRegressionHead,
    LogisticRegressionHead,
    fit_penalized_logistic,
    logistic_logits,
    transformer_baseline_parameters,
)

TRANSFORMER = overlay("manifolds", "transformer")


def _lbfgs_multinomial(feats: torch.Tensor, y: torch.Tensor, l2: float, ridge_b: float, classes: int) -> torch.Tensor:
    """An independent fit of one episode: full softmax parametrisation with class 0 pinned by a constraint-free
    reparametrisation, minimised by L-BFGS to convergence (float64)."""
    p = feats.shape[1]
    w = torch.zeros(p, classes - 1, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes - 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=2000, tolerance_grad=1e-13, tolerance_change=1e-16,
                            history_size=50, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        scores = torch.cat([torch.zeros(len(y), 1, dtype=torch.float64), feats @ w + b], dim=1)
        nll = -(scores.log_softmax(1).gather(1, y[:, None])).sum()
        loss = nll + 0.5 * l2 * (w * w).sum() + 0.5 * ridge_b * (b * b).sum()
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    return torch.cat([w, b[None]], dim=0).detach()


@pytest.mark.parametrize("classes", [2, 3])
def test_penalized_logistic_matches_lbfgs_to_convergence(classes: int) -> None:
    from lit_icl.icssl.nets.baselines import INTERCEPT_RIDGE

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(3, 30, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (3, 30), generator=g)
    labeled = torch.rand(3, 30, generator=g) < 0.5
    theta = fit_penalized_logistic(feats, y, labeled, classes, l2=0.7)
    for e in range(3):
        ref = _lbfgs_multinomial(feats[e][labeled[e]], y[e][labeled[e]], 0.7, INTERCEPT_RIDGE, classes)
        torch.testing.assert_close(theta[e], ref, atol=1e-6, rtol=1e-6)


def test_single_class_labels_predict_that_class() -> None:
    phi = torch.randn(2, 20, 4, generator=torch.Generator().manual_seed(1))
    y = torch.zeros(2, 20, dtype=torch.long)
    y[1] = 1
    labeled = torch.zeros(2, 20, dtype=torch.bool)
    labeled[:, :3] = True
    pred = LogisticRegressionHead()(phi, y, labeled).argmax(-1)
    assert (pred[0] == 0).all() and (pred[1] == 1).all()


def test_kernel_lr_equals_lr_on_kernel_columns_of_the_labeled_points() -> None:
    """ORIG+RBF-LR = logistic regression on the features kappa(x_i, x_j), j labeled, with a fixed gamma."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 25, 3, generator=g)
    y = torch.randint(0, 2, (2, 25), generator=g)
    labeled = torch.zeros(2, 25, dtype=torch.bool)
    labeled[0, :6] = True
    labeled[1, 3:12] = True  # not a prefix, and another count
    head = KernelLogisticRegressionHead(l2=0.3, gamma=0.8)
    logits = head(x, y, labeled)
    for e in range(2):
        xe = x[e].double()
        idx = labeled[e].nonzero().flatten()
        kern = torch.exp(-0.8 * ((xe[:, None, :] - xe[None, idx, :]) ** 2).sum(-1))  # (n, m)
        from lit_icl.icssl.nets.baselines import INTERCEPT_RIDGE

        theta = _lbfgs_multinomial(kern[idx], y[e][idx], 0.3, INTERCEPT_RIDGE, 2)
        expected = kern @ theta[:-1, 0] + theta[-1, 0]
        torch.testing.assert_close(logits[e, :, 1].double() - logits[e, :, 0].double(), expected,
                                   atol=1e-4, rtol=1e-4)


def test_median_heuristic_gamma_makes_kernel_lr_scale_invariant() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 30, 3, generator=g)
    y = (x[..., 0] > 0).long()
    labeled = torch.arange(30)[None] < 8
    head = KernelLogisticRegressionHead()
    torch.testing.assert_close(head(x, y, labeled), head(0.05 * x, y, labeled), atol=1e-4, rtol=1e-4)


def test_logistic_logits_has_reference_class_zero() -> None:
    feats = torch.randn(2, 5, 3, dtype=torch.float64)
    theta = torch.randn(2, 4, 2, dtype=torch.float64)
    logits = logistic_logits(feats, theta)
    assert logits.shape == (2, 5, 3) and (logits[..., 0] == 0).all()


# ---------------------------------------------------------------------------------------------------------
# Transformer baseline (App. G)
# ---------------------------------------------------------------------------------------------------------
def test_transformer_baseline_size_matches_closed_form_and_app_g() -> None:
    net = ICLTransformerBaseline()
    count = count_parameters(net)
    assert count == transformer_baseline_parameters(3, 2, 240, 960, 2, 4) == 1_391_294
    assert abs(count - 1_442_178) / 1_442_178 < 0.04  # App. G's total; see the class docstring for the gap


def test_transformer_baseline_is_permutation_equivariant_and_never_reads_unlabeled_labels() -> None:
    torch.manual_seed(0)
    net = ICLTransformerBaseline(d_model=32, num_heads=4, dim_feedforward=64).eval()
    x = torch.randn(2, 12, 3)
    y = torch.randint(0, 2, (2, 12))
    labeled = torch.arange(12).expand(2, 12) < 4
    out = net(x, y, labeled)
    perm = torch.randperm(12)
    permuted = net(x[:, perm], y[:, perm], labeled[:, perm])
    torch.testing.assert_close(permuted.logits, out.logits[:, perm], atol=1e-5, rtol=1e-5)
    flipped = torch.where(labeled, y, 1 - y)
    torch.testing.assert_close(net(x, flipped, labeled).logits, out.logits)
    assert out.features.shape == (2, 12, 4)



def test_transformer_input_norm_makes_the_baseline_blind_to_each_points_scale() -> None:
    """``input_norm``: unit-RMS points, so rescaling any point (features stored at scale 0.1 or 35) changes
    nothing, while without it the projection sees the scale; an all-zero point stays finite."""
    torch.manual_seed(0)
    net = ICLTransformerBaseline(input_dim=16, d_model=32, num_heads=4, dim_feedforward=64, input_norm=True).eval()
    x = torch.randn(2, 10, 16)
    y = torch.randint(0, 2, (2, 10))
    labeled = torch.arange(10).expand(2, 10) < 3
    scales = torch.rand(2, 10, 1) * 100 + 0.01
    out = net(x, y, labeled)
    torch.testing.assert_close(net(x * scales, y, labeled).logits, out.logits, atol=1e-5, rtol=1e-5)
    # Same as feeding explicitly normalised points to the plain net with the same weights.
    plain = ICLTransformerBaseline(input_dim=16, d_model=32, num_heads=4, dim_feedforward=64).eval()
    plain.load_state_dict(net.state_dict())
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(plain(x / rms, y, labeled).logits, out.logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain(x * scales, y, labeled).logits, out.logits, atol=1e-3)
    x[0, 0] = 0.0
    assert torch.isfinite(net(x, y, labeled).logits).all()
    with pytest.raises(ConfigError, match="input_norm"):
        ICLTransformerBaseline(input_norm="yes")

def test_method_names_follow_the_paper() -> None:
    eig_lr = ICSSLModule(SemiSupervisedICL(LaplacianEigenmap(), LogisticRegressionHead()))
    rbf_lr = ICSSLModule(SemiSupervisedICL(RawCoordinates(), KernelLogisticRegressionHead()))
    assert eig_lr.method == "EIG+LR" and rbf_lr.method == "ORIG+RBF-LR"
    assert ICSSLModule(ICLTransformerBaseline()).method == "ORIG+Transformer"
    assert ICSSLModule().method == "ORIG+E2E-ICL"


# ---------------------------------------------------------------------------------------------------------
# Through the CLI
# ---------------------------------------------------------------------------------------------------------
def _args(tmp_path, config: list[str], *extra: str) -> list[str]:
    return [
        *quiet_run_args(tmp_path, config),
        "--trainer.max_epochs", "1",
        "--trainer.callbacks", "[]",
        "--data.init_args.n_points", "20",
        "--data.init_args.batch_size", "16",
        "--data.init_args.chunk_size", "8",
        "--data.init_args.eval_batch_size", "16",
        "--data.init_args.train_batches_per_epoch", "2",
        "--data.init_args.val_episodes", "16",
        "--data.init_args.test_episodes", "16",
        "--data.init_args.eval_label_ratios", "[0.1, 0.5]",
        "--data.init_args.train_label_ratio", "[0.1, 0.5]",
        *extra,
    ]


@pytest.mark.parametrize(("config", "method"), [(overlay("manifolds", "eig_lr"), "EIG+LR"),
                                                (overlay("manifolds", "rbf_lr"), "ORIG+RBF-LR")])
def test_lr_baselines_test_through_the_cli(tmp_path, config: list[str], method: str) -> None:
    main(["test", *_args(tmp_path, config)])
    rows = json.loads((tmp_path / "runs/tiny/version_0/results.json").read_text())["rows"]
    acc = [r for r in rows if r["method"] == method and r["metric"] == "accuracy"]
    assert [r["n_labeled"] for r in acc] == [2, 10]
    assert acc[1]["value"] > 0.6
    assert [r["value"] for r in rows if r["metric"] == "parameters"] == [0]


def test_lr_baseline_refuses_fit(tmp_path, capsys) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *_args(tmp_path, overlay("manifolds", "eig_lr"))],
                    "has no trainable parameters; evaluate it with `test`")


def test_transformer_baseline_trains_and_tests(tmp_path) -> None:
    extra = ["--model.init_args.net.init_args.d_model", "32", "--model.init_args.net.init_args.dim_feedforward",
             "64"]
    main(["fit", *_args(tmp_path, TRANSFORMER, *extra)])
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    main(["test", *_args(tmp_path, TRANSFORMER, *extra), "--ckpt_path", str(ckpt)])
    rows = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"ORIG+Transformer", "labeled_majority", "class_prior"}
    reloaded = ICSSLModule.load_from_checkpoint(ckpt)
    assert isinstance(reloaded.net, ICLTransformerBaseline) and count_parameters(reloaded.net) > 0


def test_transformer_input_dim_must_match_the_data(tmp_path, capsys) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *_args(tmp_path, TRANSFORMER,
                                                     "--model.init_args.net.init_args.input_dim", "5")],
                    "input_dim=5 but the data's points have 3 coordinates")


# ---------------------------------------------------------------------------------------------------------
# Representation analysis (Sec. 4.2, Table 1): alignment with another trained model's representation
# ---------------------------------------------------------------------------------------------------------
def test_alignment_with_a_second_checkpoint_and_with_itself_is_one(tmp_path) -> None:
    from conftest import tb_scalars

    main(["fit", *tiny_args(tmp_path, "--trainer.max_epochs", "1")])
    ckpt = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    callback = json.dumps([{"class_path": "lit_icl.callbacks.RepresentationMetrics",
                            "init_args": {"k": 5, "compare_checkpoints": {"again": str(ckpt)}}}])
    main(["test", *tiny_args(tmp_path, "--trainer.callbacks", callback), "--ckpt_path", str(ckpt)])
    scalars = tb_scalars(tmp_path / "runs/tiny/version_1")
    for metric in ("mnn", "cycle_knn", "lcs_knn"):
        # The same weights on the same episodes; kNN ties between (near-)duplicate features may break
        # differently at float rounding, hence not exactly 1 (metrics of identical inputs: test_metrics.py).
        assert scalars[f"test/{metric}/again~model"][-1] == pytest.approx(1.0, abs=0.01)
        assert 0.0 <= scalars[f"test/{metric}/eig~model"][-1] < 1.0
    assert "test/separation/again" in scalars


def test_compare_checkpoint_names_cannot_shadow_own_embeddings(tmp_path) -> None:
    from lit_icl.callbacks import RepresentationMetrics
    from lit_icl.core.errors import ConfigError

    (tmp_path / "x.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError, match="taken by the module's own embeddings"):
        RepresentationMetrics(compare_checkpoints={"eig": str(tmp_path / "x.ckpt")}).check_config(model=ICSSLModule())
    with pytest.raises(ConfigError, match="no checkpoint file at"):
        RepresentationMetrics(compare_checkpoints={"tf": str(tmp_path / "y.ckpt")}).check_config(model=ICSSLModule())


def test_fast_dev_run_of_test_makes_the_results_but_writes_none_into_the_working_folder(tmp_path,
                                                                                       monkeypatch) -> None:
    """fast_dev_run turns the logger off, so results used to land in the working folder (results.json, PNGs)."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    main(["test", *_args(tmp_path, [str(repo / c) for c in overlay("manifolds", "eig_lr")],
                         "--trainer.fast_dev_run", "true")])
    assert list(tmp_path.iterdir()) == []

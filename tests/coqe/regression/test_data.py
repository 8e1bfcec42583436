"""CoQE regression prompts (App. C.1): function classes, the four test shifts, purity of the generated data."""

from __future__ import annotations

import math

import pytest
import torch

from lit_icl.coqe.regression.data import (
    PAPER_SHIFTS,
    RegressionDataModule,
    combination_features,
    parse_shift,
    relu_first_layer,
    sample_prompts,
)
from lit_icl.coqe.regression.nets import (
    LeastSquares,
)


# ------------------------------------------------------------------------------------------ generators
def test_sparse_weights_have_exactly_s_nonzeros() -> None:
    p = sample_prompts("sparse", 64, 30, 10, torch.Generator().manual_seed(0), sparsity=3)
    w = torch.linalg.lstsq(p["xs"].double(), p["ys"].double()[..., None]).solution[..., 0]  # (64, 10)
    assert ((w.abs() > 1e-6).sum(-1) == 3).all()
    # with a dims curriculum the support lies among the active coordinates
    p = sample_prompts("sparse", 32, 30, 10, torch.Generator().manual_seed(1), sparsity=3, active_dims=6)
    assert (p["xs"][..., 6:] == 0).all()
    w = torch.linalg.lstsq(p["xs"][..., :6].double(), p["ys"].double()[..., None]).solution[..., 0]
    assert ((w.abs() > 1e-6).sum(-1) == 3).all()


def test_relu_first_layer_is_shared_by_all_prompts_and_splits() -> None:
    dm = RegressionDataModule("relu", n_points=20, chunk_size=8, batch_size=8, eval_batch_size=8,
                              val_prompts=8, test_prompts=8, generate_on_device=False)
    W = relu_first_layer(0, 5, 10)
    assert torch.equal(dm.first_layer, W) and not torch.equal(W, relu_first_layer(1, 5, 10))
    batches = [next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader())), next(iter(dm.test_dataloader()[0]))]
    for batch in batches:
        for first, fits in ((W, True), (relu_first_layer(1, 5, 10), False)):
            feats = torch.relu(batch["xs"] @ first).double()
            a = torch.linalg.lstsq(feats, batch["ys"].double()[..., None]).solution
            resid = ((feats @ a)[..., 0] - batch["ys"]).pow(2).mean() / batch["ys"].pow(2).mean()
            assert (resid < 1e-8) == fits
    # second layer a_i ~ N(0, 2/h): E[y^2] = sum_i (2/h) E[ReLU(w_i^T x)^2] = (2/h) sum_i |w_i|^2 / 2
    p = sample_prompts("relu", 4000, 4, 5, torch.Generator().manual_seed(2), first_layer=W)
    expected = float((W**2).sum() / 10)
    assert abs(float(p["ys"].pow(2).mean()) / expected - 1) < 0.1


def test_combination_features_and_inputs() -> None:
    x = torch.tensor([[-2.0, 3.0, -1.5, 1.0 / 3.0, 1.0]])
    expected = torch.tensor([[2.0, 9.0, -3.375, 0.5, math.exp(0.2)]])
    assert torch.allclose(combination_features(x), expected, atol=1e-6)
    p = sample_prompts("combination", 2000, 5, 5, torch.Generator().manual_seed(0))
    assert abs(float(p["xs"].mean())) < 0.02 and abs(float(p["xs"].std()) - 1) < 0.02
    w = torch.linalg.lstsq(combination_features(p["xs"][:3]).double(), p["ys"][:3].double()[..., None]).solution
    assert torch.allclose(combination_features(p["xs"][:3]).double() @ w, p["ys"][:3].double()[..., None], atol=1e-4)


def _pair(shift: str, fc: str = "linear", b: int = 2000, n: int = 6, d: int = 10) -> tuple[dict, dict]:
    kw = {"first_layer": relu_first_layer(0, d, 10)} if fc == "relu" else {}
    base = sample_prompts(fc, b, n, d, torch.Generator().manual_seed(9), **kw)
    shifted = sample_prompts(fc, b, n, d, torch.Generator().manual_seed(9), shift=parse_shift(shift), **kw)
    return base, shifted


@pytest.mark.parametrize("scale", [0.8, 1.2])
def test_x_scale_scales_the_context_and_the_query(scale: float) -> None:
    # App. C.1: D_X^train != D_X^test = D_query, so the queries are the prompt's own (scaled) next inputs
    base, sh = _pair(f"x_scale={scale}")
    assert torch.allclose(sh["xs"], scale * base["xs"]) and torch.allclose(sh["ys"], scale * base["ys"], atol=1e-5)
    assert "xq" not in sh and abs(float(sh["xs"].std()) - scale) < 0.02 * scale


@pytest.mark.parametrize("scale", [0.8, 1.2])
def test_least_squares_error_under_x_scale_is_the_closed_form(scale: float) -> None:
    """Min-norm least squares on k < d isotropic examples: E[(w^T x_q - w_k^T x_q)^2] / d = c^2 (1 - k/d); 0 for k >= d.

    At k = 0 it predicts 0, so the error is E[(w^T x_q)^2] / d = c^2 (1.44 at c = 1.2; an unscaled query scores
    1). Per position the normalised error has standard deviation <= c^2 sqrt(2 + 6/d) (a product-normal fourth
    moment), so 8,000 seeded prompts give a standard error <= 0.027 c^2; the tolerance is 0.1 c^2 (about 4 of them).
    """
    d, n, b = 5, 11, 8000
    p = sample_prompts("linear", b, n, d, torch.Generator().manual_seed(3), shift=parse_shift(f"x_scale={scale}"))
    xq, yq = p.get("xq"), p.get("yq", p["ys"])  # as CoQERegressionModule.test_step scores it
    err = ((LeastSquares()(p["xs"], p["ys"], xq).double() - yq.double()) ** 2).mean(0) / d
    k = torch.arange(n, dtype=torch.float64)
    expected = scale**2 * (1 - k / d).clamp_min(0)
    assert torch.allclose(err[:d], expected[:d], atol=0.1 * scale**2), (err, expected)
    assert float(err[d:].max()) < 1e-8


def test_query_std_widens_only_the_query() -> None:
    base, sh = _pair("query_std=3")
    assert torch.equal(sh["xs"], base["xs"]) and torch.equal(sh["ys"], base["ys"])
    assert abs(float(sh["xq"].std()) - 3) < 0.06
    # the same function labels the queries: y_q is linear in x_q with the context's w
    base, sh = _pair("query_std=3", n=12)
    w = torch.linalg.lstsq(sh["xs"].double(), sh["ys"].double()[..., None]).solution
    assert torch.allclose(sh["xq"].double() @ w, sh["yq"].double()[..., None], atol=1e-4, rtol=1e-5)


def test_orthant_fixes_each_coordinates_sign_per_prompt() -> None:
    base, sh = _pair("orthant")
    assert torch.equal(sh["xs"].abs(), base["xs"].abs())
    signs = torch.sign(sh["xs"])
    assert (signs == signs[:, :1]).all()  # one orthant per prompt
    frac = float((signs[:, 0] > 0).float().mean())
    assert 0.45 < frac < 0.55  # the orthant is random
    q = sh["xq"]
    assert not (torch.sign(q) == torch.sign(q[:, :1])).all() and abs(float(q.std()) - 1) < 0.02


@pytest.mark.parametrize("fc", ["linear", "relu"])
def test_w_scale_scales_the_task(fc: str) -> None:
    d = 10 if fc == "linear" else 5
    base, sh = _pair("w_scale=1.2", fc=fc, d=d)
    assert torch.equal(sh["xs"], base["xs"]) and "xq" not in sh
    assert torch.allclose(sh["ys"], 1.2 * base["ys"], atol=1e-5)


def test_data_is_a_pure_function_of_the_index_on_device_or_in_the_loader() -> None:
    common = {
        "function_class": "sparse", "n_points": 9, "chunk_size": 4, "batch_size": 8, "eval_batch_size": 8,
        "val_prompts": 8, "test_prompts": 8, "shifts": ["id", *PAPER_SHIFTS], "curriculum_points": [3, 9, 2, 1],
        "train_batches_per_epoch": 3,
    }
    on_dev, in_loader = RegressionDataModule(**common), RegressionDataModule(**common, generate_on_device=False)
    for i, (a, b) in enumerate(zip(on_dev.test_dataloader(), in_loader.test_dataloader())):
        ba, bb = on_dev.on_after_batch_transfer(next(iter(a)), i), next(iter(b))
        assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
        assert ("xq" in ba) == parse_shift(on_dev.shift_names[i]).separate_queries
    # training: the curriculum follows the step encoded in the index; epochs differ; items repeat exactly
    loader = in_loader.train_dataloader()
    shapes = [tuple(b["xs"].shape) for b in loader]
    assert shapes == [(8, 3, 10), (8, 5, 10), (8, 7, 10)]
    loader.sampler.set_epoch(1)
    later = [tuple(b["xs"].shape) for b in loader]
    assert later == [(8, 9, 10)] * 3  # step 3.. : the curriculum has reached its end
    again = next(iter(in_loader.train_dataloader()))
    first = next(iter(in_loader.train_dataloader()))
    assert torch.equal(again["xs"], first["xs"])

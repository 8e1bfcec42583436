"""Nets for in-context regression (CoQE paper Sec. 4.1, 5.1, App. C.1): two trained models, five solvers.

Every net maps a prompt to predictions at every prefix with one signature::

    net(xs (B, n, d), ys (B, n), xq (B, n, d) | None) -> (B, n)

Prediction ``i`` (0-based) uses only the first ``i`` examples ``(xs[:, :i], ys[:, :i])`` as context and the query
``xq[:, i]`` (``xs[:, i]`` when ``xq`` is None, the in-distribution layout of training). None may see a label at
or after the position it predicts (tested for every net).

Trained (same embedding, same backbone, App. C.1: width 64, 3 layers, 2 heads):

- :class:`RegressionTransformer`: Garg et al.'s GPT-2-style model over tokens ``x_1, y_1, ..., x_n, y_n`` (a label
  token is ``[y, 0, ..., 0]``), its input embedding the two-layer ReLU network (Linear, ReLU, LayerNorm, Linear),
  a linear read-out at every ``x`` token;
- :class:`CoQERegressor`: CoQE, Eq. (11): that ReLU network is the token-wise sample encoder of every token, the
  same Transformer is the task encoder over the context, and ``y_hat = <t(context), s(x_q)>``. The task
  representation of the first ``i`` examples is the encoder's output at the label token ``y_i`` (Sec. 4.1: "the
  final output token"); the empty context has a learned vector. (The public code shifts the task vectors with a
  wrap-around ``roll``, so the first prediction reads the last token of the whole prompt: a label leak. Not here.)

Parameter-free baselines (batched torch solvers fit per prompt and per prefix inside ``forward``; each predicts
0 from an empty context):

- :class:`LeastSquares`: minimum-norm least squares (the optimal estimator for linear functions);
- :class:`Lasso`: ``min_w 1/(2i) ||y - X w||^2 + alpha ||w||_1`` by coordinate descent (sklearn's objective);
- :class:`TwoLayerNN`: a two-layer ReLU network of the data's architecture fit to the context by Adam;
- :class:`Averaging`: ``w = mean_j y_j x_j``, ``y_hat = w^T x_q``;
- :class:`NearestNeighbours`: mean label of the ``k`` nearest context inputs.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lit_icl.coqe.layers import CausalTransformer
from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.precision import float32_region
from lit_icl.core.validation import check_int, check_literal, check_positive

__all__ = [
    "Averaging", "CoQERegressor", "Lasso", "LeastSquares", "NearestNeighbours", "RegressionTransformer",
    "TwoLayerNN", "interleave",
]


def interleave(xs: Tensor, ys: Tensor) -> Tensor:
    """Tokens ``x_1, [y_1, 0, ..], x_2, ...`` as ``(B, 2n, d)`` (Garg et al.: the label in coordinate 0)."""
    b, n, d = xs.shape
    tokens = xs.new_zeros(b, 2 * n, d)
    tokens[:, 0::2] = xs
    tokens[:, 1::2, 0] = ys.to(xs.dtype)
    return tokens


def _check_prompt(xs: Tensor, ys: Tensor, xq: Tensor | None, n_dims: int | None = None) -> None:
    if xs.dim() != 3 or ys.shape != xs.shape[:2]:
        raise ValueError(f"expected xs (B, n, d) and ys (B, n), got {tuple(xs.shape)} and {tuple(ys.shape)}")
    if n_dims is not None and xs.shape[-1] != n_dims:
        raise ValueError(f"the net was built for n_dims={n_dims}, the prompts have {xs.shape[-1]}")
    if xq is not None and xq.shape != xs.shape:
        raise ValueError(f"xq must have the shape of xs {tuple(xs.shape)}, got {tuple(xq.shape)}")


# ------------------------------------------------------------------------------------------ trained nets
class ReLUEmbedding(nn.Sequential):
    """App. C.1's two-layer ReLU network: Linear(d, m), ReLU, LayerNorm(m), Linear(m, m)."""

    def __init__(self, n_dims: int, width: int):
        super().__init__(nn.Linear(n_dims, width), nn.ReLU(), nn.LayerNorm(width), nn.Linear(width, width))


class GPT2Backbone(nn.Module):
    """GPT-2's body on given input embeddings: learned absolute positions, pre-LN causal blocks, final LN.

    The blocks are :class:`lit_icl.coqe.omniglot.nets.CausalTransformer` (``scaled_dot_product_attention``, causal, GELU
    MLP of 4x width). Weights follow GPT-2's initialisation: N(0, 0.02) for linear layers and positions,
    output projections of the residual branches scaled by ``1/sqrt(2 * depth)``, zero biases.
    """

    def __init__(self, width: int, depth: int, heads: int, max_tokens: int):
        super().__init__()
        self.positions = nn.Parameter(torch.zeros(max_tokens, width))
        self.blocks = CausalTransformer(width, depth, heads)
        nn.init.normal_(self.positions, std=0.02)
        for name, module in self.blocks.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("attn.out", "mlp.2")) else 0.02
                nn.init.normal_(module.weight, std=std)
                nn.init.zeros_(module.bias)

    def forward(self, h: Tensor, position_ids: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """``h (B, T, width)``; ``position_ids (T,)`` default ``0 .. T-1``; ``mask (T, T)`` default causal."""
        t = h.shape[1]
        if position_ids is None:
            if t > self.positions.shape[0]:
                raise ValueError(f"{t} tokens exceed the {self.positions.shape[0]} learned positions; raise max_points")
            pos = self.positions[:t]
        else:
            if int(position_ids.max()) >= self.positions.shape[0]:
                raise ValueError(f"position {int(position_ids.max())} exceeds the learned positions; raise max_points")
            pos = self.positions[position_ids]
        return self.blocks(h + pos.to(h.dtype), mask)


def _check_sizes(n_dims: int, width: int, depth: int, heads: int, max_points: int) -> None:
    for name, value in (("n_dims", n_dims), ("width", width), ("depth", depth), ("heads", heads),
                        ("max_points", max_points)):
        check_positive(name, value, integer=True)
    if width % heads:
        raise ConfigError(f"width={width} is not divisible by heads={heads}; choose heads dividing the width")


class RegressionTransformer(RecordedNet):
    """The Transformer baseline (App. C.1; Garg et al.): ReLU-MLP embedding, GPT-2 body, linear read-out.

    Args:
        n_dims: input dimension d (the data's).
        width: embedding size (64).
        depth: layers (3).
        heads: attention heads (2).
        max_points: longest prompt (learned positions for ``2 * max_points`` tokens).
    """

    method = "transformer"

    def __init__(self, n_dims: int = 10, width: int = 64, depth: int = 3, heads: int = 2, max_points: int = 101):
        super().__init__()
        _check_sizes(n_dims, width, depth, heads, max_points)
        self.n_dims, self.max_points = n_dims, max_points
        self.read_in = ReLUEmbedding(n_dims, width)
        self.backbone = GPT2Backbone(width, depth, heads, 2 * max_points)
        self.read_out = nn.Linear(width, 1)

    def sample_representation(self, x: Tensor) -> Tensor:
        """The embedding of an input token ``(..., d) -> (..., width)``."""
        return self.read_in(x)

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor:
        _check_prompt(xs, ys, xq, self.n_dims)
        h = self.read_in(interleave(xs, ys))
        if xq is None:
            return self.read_out(self.backbone(h)[:, 0::2]).squeeze(-1)
        # Queries from another distribution: query i takes the place of x_{i+1} (position 2i) and attends to the
        # 2i context tokens before it and to itself; the context tokens stay causal and never see a query. One
        # pass over 3n tokens equals n prompts with x_{i+1} replaced (tested).
        n = xs.shape[1]
        dev = xs.device
        ctx, q = torch.arange(2 * n, device=dev), torch.arange(n, device=dev)
        mask = torch.zeros(3 * n, 3 * n, dtype=torch.bool, device=dev)
        mask[: 2 * n, : 2 * n] = ctx[None, :] <= ctx[:, None]
        mask[2 * n :, : 2 * n] = ctx[None, :] < 2 * q[:, None]
        mask[2 * n + q, 2 * n + q] = True
        positions = torch.cat([ctx, 2 * q])
        z = self.backbone(torch.cat([h, self.read_in(xq)], dim=1), positions, mask)
        return self.read_out(z[:, 2 * n :]).squeeze(-1)


class CoQERegressor(RecordedNet):
    """CoQE for regression, Eq. (11): ``y_hat_q = <E_task(E_sample(z_1:i)), E_sample(x_q)>`` (Sec. 4.1).

    ``E_sample`` (the two-layer ReLU network) embeds every token independently; ``E_task`` (the GPT-2 body)
    reads the embedded context; the task representation of the first ``i`` examples is its output at the
    label token ``y_i``, which attends only to ``x_1, y_1, ..., x_i, y_i``: the query never enters the task
    encoder, and prediction ``i`` reads no label at or after ``i``. All prefixes come from one pass.

    Args:
        n_dims, width, depth, heads, max_points: as :class:`RegressionTransformer` (App. C.1: same sizes).
        task_head: ``none`` (Sec. 4.1: the output token itself is the task representation) or ``mlp``
            (the public code: Linear, ReLU, Linear on the output token).
        output_scale: constant factor on the inner product, ``y_hat = c <t, s(x_q)>``; ``null`` (default) =
            ``1 / sqrt(width)``; ``1.0`` = Eq. (11) literally. It changes no function the net can represent (the
            last layer of ``s`` absorbs it), only the start of training: ``t`` leaves the task encoder's final
            LayerNorm with unit-variance coordinates, so the raw sum over ``width`` products starts with a
            standard deviation of about ``sqrt(width / 3)`` (an initial error of about 40 x the zero predictor's
            on linear d = 5); Adam first shrinks that to the zero predictor, whose plateau every net here must
            then leave. ``1 / sqrt(width)`` starts the predictions at the labels' scale for any width, as attention
            scales its logits. It shortened the plateau on 2 of 3 seeds at 11 points, not at 21 points (one seed):
            the plateau's length varies by seed and prompt length either way (measured in
            ``experiments/results/coqe_regression_cpu.md``).
    """

    method = "coqe"

    def __init__(
        self,
        n_dims: int = 10,
        width: int = 64,
        depth: int = 3,
        heads: int = 2,
        max_points: int = 101,
        task_head: Literal["none", "mlp"] = "none",
        output_scale: float | None = None,
    ):
        super().__init__()
        _check_sizes(n_dims, width, depth, heads, max_points)
        check_literal("task_head", task_head, Literal["none", "mlp"])
        #: Multiplies ``<t, s(x_q)>``; ``None`` = ``1 / sqrt(width)`` (see the class docstring).
        self.output_scale = (
            1 / math.sqrt(width) if output_scale is None else check_positive("output_scale", output_scale)
        )
        self.n_dims, self.max_points = n_dims, max_points
        self.sample_encoder = ReLUEmbedding(n_dims, width)
        self.task_encoder = GPT2Backbone(width, depth, heads, 2 * max_points)
        self.task_head = (
            nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)) if task_head == "mlp"
            else nn.Identity()
        )
        #: Task representation of the empty context (prediction 0); zero at init, i.e. predicts 0.
        self.empty_task = nn.Parameter(torch.zeros(width))

    def sample_representation(self, x: Tensor) -> Tensor:
        """``E_sample(x)``: ``(..., d) -> (..., width)`` (the learned space of Fig. 6)."""
        return self.sample_encoder(x)

    def task_representations(self, xs: Tensor, ys: Tensor) -> Tensor:
        """``(B, n + 1, width)``: the task representation of the first ``i`` examples, ``i = 0 .. n``."""
        s = self.sample_encoder(interleave(xs, ys))
        t = self.task_head(self.task_encoder(s))[:, 1::2]  # after y_1 .. y_n
        empty = self.empty_task.to(t.dtype).expand(t.shape[0], 1, -1)
        return torch.cat([empty, t], dim=1)

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor:
        _check_prompt(xs, ys, xq, self.n_dims)
        # The last label token is only needed by a prediction after the prompt: drop it (and its position).
        t = self.task_representations(xs[:, :-1], ys[:, :-1])  # (B, n, width): prefixes 0 .. n-1
        s_q = self.sample_encoder(xs if xq is None else xq)
        return (t * s_q).sum(-1) * self.output_scale


# ------------------------------------------------------------------------------------------ baselines
def _prefix_mask(n: int, device: torch.device) -> Tensor:
    """``mask[i, j] = j < i``: example ``j`` is in the context of prediction ``i``."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)


def _prefix_designs(xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Zero-padded per-prefix systems: ``X (B, n, n, d)``, ``y (B, n, n)`` (rows ``j >= i`` zero), counts ``(n,)``.

    Zero rows change neither ``X^T X`` nor ``X^T y``, so a solver on the padded system of prefix ``i`` returns
    the solution of the first ``i`` examples (with the loss normalised by the true count).
    """
    n = xs.shape[1]
    mask = _prefix_mask(n, xs.device).to(xs.dtype)
    return xs[:, None] * mask[None, :, :, None], ys[:, None] * mask[None], mask.sum(1)


class _Baseline(RecordedNet):
    """A solver with no trainable parameters (``fit`` refuses it; evaluate with ``test``)."""

    method = "baseline"

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor:
        _check_prompt(xs, ys, xq)
        return self.solve(xs.double(), ys.double(), (xs if xq is None else xq).double()).to(xs.dtype)

    def solve(self, xs: Tensor, ys: Tensor, xq: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise TypeError(f"{type(self).__name__} must define solve()")


class LeastSquares(_Baseline):
    """Minimum-norm least squares on each prefix: ``w_i = pinv(X_:i) y_:i`` (App. C.1: optimal for linear f).

    Solved in float64 through the SVD-based pseudo-inverse of the zero-padded systems (one batched call); the
    minimum-norm solution is what the underdetermined prefixes ``i < d`` need.
    """

    method = "least_squares"

    @float32_region
    def solve(self, xs: Tensor, ys: Tensor, xq: Tensor) -> Tensor:
        X, y, _ = _prefix_designs(xs, ys)
        w = (torch.linalg.pinv(X) @ y.unsqueeze(-1)).squeeze(-1)  # (B, n, d)
        return (w * xq).sum(-1)


def lasso_coordinate_descent(
    X: Tensor, y: Tensor, count: Tensor, alpha: float, max_iter: int = 1000, tol: float = 1e-10
) -> Tensor:
    """Batched Lasso ``min_w 1/(2 count) ||y - X w||^2 + alpha ||w||_1`` by cyclic coordinate descent.

    ``X (..., m, d)``, ``y (..., m)``, ``count (...)`` (rows that count; padded rows must be zero). Sweeps stop when
    no coordinate moved by more than ``tol`` times the largest weight (or after ``max_iter`` sweeps).
    """
    batch, d = X.shape[:-2], X.shape[-1]
    cnt = count.clamp_min(1).to(X.dtype)
    col = (X**2).sum(-2) / cnt[..., None]  # (..., d)
    w = X.new_zeros(*batch, d)
    r = y.clone()
    for _ in range(max_iter):
        moved = X.new_zeros(batch)
        for j in range(d):
            xj, wj = X[..., j], w[..., j]
            rho = (xj * r).sum(-1) / cnt + col[..., j] * wj
            new = torch.where(col[..., j] > 0, torch.sign(rho) * (rho.abs() - alpha).clamp_min(0) / col[..., j].clamp_min(1e-300), 0.0)
            delta = new - wj
            r = r - xj * delta[..., None]
            w[..., j] = new
            moved = torch.maximum(moved, delta.abs())
        if bool((moved <= tol * w.abs().amax(-1).clamp_min(1.0)).all()):
            break
    return w


class Lasso(_Baseline):
    """Lasso on each prefix, sklearn's objective ``1/(2i) ||y - X w||^2 + alpha ||w||_1``, no intercept.

    Garg et al. use the grid alpha in {1, 0.1, 0.01, 0.001, 0.0001}; list one net per alpha (method
    ``lasso(alpha=...)``); the public CoQE code keeps 0.01.
    """

    def __init__(self, alpha: float = 0.01, max_iter: int = 1000, tol: float = 1e-10):
        super().__init__()
        self.alpha = check_positive("alpha", alpha)
        self.max_iter = check_positive("max_iter", max_iter, integer=True)
        self.tol = check_positive("tol", tol)
        self.method = f"lasso(alpha={alpha:g})"

    @float32_region
    def solve(self, xs: Tensor, ys: Tensor, xq: Tensor) -> Tensor:
        X, y, count = _prefix_designs(xs, ys)
        w = lasso_coordinate_descent(X, y, count.expand(xs.shape[0], -1), self.alpha, self.max_iter, self.tol)
        return (w * xq).sum(-1)


class Averaging(_Baseline):
    """``w_i = (1/i) sum_{j<i} y_j x_j``, ``y_hat = w_i^T x_q`` (Garg et al.'s averaging estimator)."""

    method = "averaging"

    def solve(self, xs: Tensor, ys: Tensor, xq: Tensor) -> Tensor:
        s = torch.cumsum(xs * ys[..., None], dim=1)
        s = torch.cat([torch.zeros_like(s[:, :1]), s[:, :-1]], dim=1)  # sum over j < i
        i = torch.arange(xs.shape[1], device=xs.device, dtype=xs.dtype).clamp_min(1)
        return (s / i[None, :, None] * xq).sum(-1)


class NearestNeighbours(_Baseline):
    """Mean label of the ``k`` nearest context inputs (Euclidean; all ``i`` of them while ``i < k``)."""

    method = "nearest_neighbours"

    def __init__(self, k: int = 3):
        super().__init__()
        self.k = check_positive("k", k, integer=True, hint="the neighbours the NearestNeighbours baseline averages")
        self.method = f"{k}-nn"

    def solve(self, xs: Tensor, ys: Tensor, xq: Tensor) -> Tensor:
        n = xs.shape[1]
        dist = torch.cdist(xq, xs)  # (B, n queries, n examples)
        dist = dist.masked_fill(~_prefix_mask(n, xs.device), math.inf)
        k = min(self.k, n)
        near, idx = dist.topk(k, dim=-1, largest=False)
        valid = near.isfinite().to(xs.dtype)
        labels = ys[:, None, :].expand(-1, n, -1).gather(-1, idx)
        return (labels * valid).sum(-1) / valid.sum(-1).clamp_min(1)


class TwoLayerNN(_Baseline):
    """A two-layer ReLU network ``x -> a^T ReLU(W x) (+ biases)`` fit to each prefix by Adam (App. C.1).

    One independent network per prompt and prefix, all trained together: the loss is the sum over networks
    of each one's mean squared error on its own context, so every network gets exactly its own gradient and
    Adam's element-wise update is the per-network Adam. Initialisation: PyTorch's ``nn.Linear`` default
    (uniform, ``1/sqrt(fan_in)``) from a generator seeded by ``seed``, so predictions are deterministic.
    Training runs in float32 with gradients enabled even under ``test``'s inference mode.

    Args:
        hidden: hidden units (10: the ReLU class's architecture; Garg et al. use 100).
        steps: Adam steps (100 in Garg et al., 50 in the public CoQE code).
        lr: Adam learning rate (5e-3).
        bias: biases in both layers (the function class has none).
        seed: initialisation seed.
    """

    method = "two_layer_nn"

    def __init__(self, hidden: int = 10, steps: int = 100, lr: float = 5e-3, bias: bool = False, seed: int = 0):
        super().__init__()
        self.hidden = check_positive("hidden", hidden, integer=True)
        self.steps = check_positive("steps", steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.bias, self.seed = bool(bias), check_int("seed", seed, 0)

    @float32_region
    def solve(self, xs: Tensor, ys: Tensor, xq: Tensor) -> Tensor:
        b, n, d = xs.shape
        h, dev = self.hidden, xs.device
        g = torch.Generator().manual_seed(self.seed)

        def uniform(*shape: int, fan_in: int) -> Tensor:
            return ((torch.rand(*shape, generator=g) * 2 - 1) / math.sqrt(fan_in)).to(dev).requires_grad_()

        with torch.inference_mode(False), torch.enable_grad():
            x, y, q = xs.float().clone(), ys.float().clone(), xq.float().clone()
            mask = _prefix_mask(n, dev).float()  # (n prefixes, n examples)
            count = mask.sum(1).clamp_min(1)
            params = [uniform(b, n, d, h, fan_in=d), uniform(b, n, h, fan_in=h)]
            if self.bias:
                params += [uniform(b, n, h, fan_in=d), uniform(b, n, fan_in=h)]
            opt = torch.optim.Adam(params, lr=self.lr)

            def predict(inputs: Tensor) -> Tensor:  # inputs (B, n prefixes, m, d) -> (B, n, m)
                z = torch.einsum("bimd,bidh->bimh", inputs, params[0])
                if self.bias:
                    z = z + params[2][:, :, None]
                out = torch.einsum("bimh,bih->bim", torch.relu(z), params[1])
                return out + params[3][:, :, None] if self.bias else out

            ctx = x[:, None].expand(b, n, n, d)
            for _ in range(self.steps):
                opt.zero_grad(set_to_none=True)
                err = (predict(ctx) - y[:, None]) ** 2  # (B, prefix, example)
                loss = ((err * mask).sum(-1) / count).sum()
                loss.backward()
                opt.step()
            with torch.no_grad():
                pred = predict(q[:, :, None])[..., 0]
        # An empty context fits nothing: predict 0 like the other baselines.
        return (pred * (mask.sum(1) > 0)).detach().to(xs.dtype)

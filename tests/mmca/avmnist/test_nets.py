"""Corrupted avMNIST (mmca Sec. 7, Table 1; App. I): the nets against a hand-written reference of App. I.3-I.4
and Table 1's parameter counts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lit_icl.core.nets import count_parameters
from lit_icl.mmca import (
    BidirectionalCrossAttention,
    MultimodalCrossAttention,
)
from lit_icl.mmca.avmnist.nets import ConvTokenizer, GridPool, pooling_windows, window_average

# ---------------------------------------------------------------------------------------------- nets


@pytest.mark.parametrize(
    ("net", "ours", "table1"),
    [
        (lambda: MultimodalCrossAttention(True, True), 43_754, 4.36e4),
        (lambda: MultimodalCrossAttention(True, False), 38_314, 3.82e4),
        (lambda: MultimodalCrossAttention(False, True), 43_722, 4.36e4),
        (lambda: MultimodalCrossAttention(False, False), 38_282, 3.82e4),
        (lambda: BidirectionalCrossAttention(), 60_746, 6.07e4),
    ],
)
def test_parameter_counts_match_table_1(net, ours: int, table1: float) -> None:
    n = count_parameters(net())
    assert n == ours
    assert abs(n - table1) / table1 < 0.01


def _mha(q: torch.Tensor, kv: torch.Tensor, attn: torch.nn.MultiheadAttention) -> torch.Tensor:
    """Softmax multi-head attention written out from the module's weights (no dropout)."""
    d, h = q.shape[-1], attn.num_heads
    wq, wk, wv = attn.in_proj_weight.split(d)
    bq, bk, bv = attn.in_proj_bias.split(d)

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], h, d // h).transpose(1, 2)

    qh, kh, vh = heads(q @ wq.T + bq), heads(kv @ wk.T + bk), heads(kv @ wv.T + bv)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(d // h)
    out = (scores.softmax(-1) @ vh).transpose(1, 2).reshape(q.shape)
    return out @ attn.out_proj.weight.T + attn.out_proj.bias


def _ln(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def _ffn(x: torch.Tensor, ffn: torch.nn.Module) -> torch.Tensor:
    l1, l2 = ffn.net[0], ffn.net[3]
    return F.gelu(x @ l1.weight.T + l1.bias) @ l2.weight.T + l2.bias


def _head(h: torch.Tensor, head: torch.nn.Sequential) -> torch.Tensor:
    return _ffn(_ln(h, head[0]), type("H", (), {"net": [head[1], None, None, head[4]]})())


def _tokens(
    net: torch.nn.Module, image: torch.Tensor, audio: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """App. I.2 tokenizers written with functional ops: tokens are the 4x4 grid cells in row-major order."""

    def phi(x: torch.Tensor, tok: torch.nn.Module) -> torch.Tensor:
        c = [m for m in tok.body if isinstance(m, torch.nn.Conv2d)]
        x = F.relu(
            F.conv2d(
                F.relu(F.conv2d(x, c[0].weight, c[0].bias, padding=1)), c[1].weight, c[1].bias, padding=1
            )
        )
        x = F.max_pool2d(x, 2)
        x = F.relu(
            F.conv2d(
                F.relu(F.conv2d(x, c[2].weight, c[2].bias, padding=1)), c[3].weight, c[3].bias, padding=1
            )
        )
        x = F.adaptive_avg_pool2d(F.max_pool2d(x, 2), 4)
        return _ln(x.permute(0, 2, 3, 1).reshape(x.shape[0], 16, -1), tok.norm)

    t = net.tokens
    xi, xa = phi(image, t.image) + t.pos_image, phi(audio, t.audio) + t.pos_audio
    if t.mod_image is not None:
        xi, xa = xi + t.mod_image, xa + t.mod_audio
    return xi, xa


def _reference_paper_model(
    net: MultimodalCrossAttention, image: torch.Tensor, audio: torch.Tensor
) -> torch.Tensor:
    """App. I.3 equation by equation: F_0 = X W0^T + b0; A = MHA(LN F, LN X, LN X) (or self-attention);
    F~ = F + A; S = sigmoid(F~ WG^T + bG) * (X WS^T + bS); F- = F~ + S; F = F- + FFN(LN F-); head(F_T[CLS])."""
    xi, xa = _tokens(net, image, audio)
    x = torch.cat([net.cls.expand(len(image), 1, -1), xi, xa], 1)
    f = x @ net.init_state.weight.T + net.init_state.bias
    for layer in net.layers:
        q = _ln(f, layer.norm_state)
        kv = _ln(x, net.norm_x) if net.cross_attention else q
        f = f + _mha(q, kv, layer.attn)
        if net.injection:
            gate = torch.sigmoid(f @ layer.gate.weight.T + layer.gate.bias)
            f = f + gate * (x @ layer.inject.weight.T + layer.inject.bias)
        f = f + _ffn(_ln(f, layer.norm_ffn), layer.ffn)
    return _head(f[:, 0], net.head)


@pytest.mark.parametrize(("ca", "inj"), [(True, True), (True, False), (False, True), (False, False)])
def test_paper_models_match_the_appendix_equations(ca: bool, inj: bool) -> None:
    torch.manual_seed(0)
    net = MultimodalCrossAttention(ca, inj, depth=3).eval()
    image, audio = torch.rand(5, 1, 28, 28), torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(
            net(image, audio), _reference_paper_model(net, image, audio), rtol=1e-4, atol=1e-5
        )
    assert (
        net.method
        == {
            (True, True): "full",
            (True, False): "no_injection",
            (False, True): "no_cross_attention",
            (False, False): "no_injection_no_cross_attention",
        }[(ca, inj)]
    )


def test_bidirectional_baseline_matches_the_appendix_equations() -> None:
    torch.manual_seed(1)
    net = BidirectionalCrossAttention(depth=2).eval()
    image, audio = torch.rand(4, 1, 28, 28), torch.rand(4, 1, 112, 112)  # audio at avMNIST's stored size
    u, v = _tokens(net, image, audio)
    for layer in net.layers:
        nu, nv = _ln(u, layer.norm_u), _ln(v, layer.norm_v)
        u, v = u + _mha(nu, nv, layer.attn_u), v + _mha(nv, nu, layer.attn_v)
        u = u + _ffn(_ln(u, layer.norm_ffn_u), layer.ffn_u)
        v = v + _ffn(_ln(v, layer.norm_ffn_v), layer.ffn_v)
    expect = _head(torch.cat([u.mean(1), v.mean(1)], -1), net.head)
    with torch.no_grad():
        torch.testing.assert_close(net(image, audio), expect, rtol=1e-4, atol=1e-5)


def test_zero_injection_weights_reduce_the_full_model_to_the_no_injection_ablation() -> None:
    """S_t = G * (X W_S^T + b_S) vanishes when W_S = b_S = 0: then the two models compute the same logits."""
    torch.manual_seed(2)
    full = MultimodalCrossAttention(True, True, depth=2).eval()
    for layer in full.layers:
        torch.nn.init.zeros_(layer.inject.weight)
        torch.nn.init.zeros_(layer.inject.bias)
    ablation = MultimodalCrossAttention(True, False, depth=2).eval()
    missing = ablation.load_state_dict(full.state_dict(), strict=False)
    assert not missing.missing_keys and all(".inject." in k or ".gate." in k for k in missing.unexpected_keys)
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(full(x, x.flip(-1)), ablation(x, x.flip(-1)))


@pytest.mark.parametrize("net", [MultimodalCrossAttention, BidirectionalCrossAttention])
def test_dropout_zero_means_none_so_training_mode_changes_nothing(net) -> None:
    torch.manual_seed(0)
    model = net(dropout=0.0)
    images, audio = torch.randn(3, 1, 28, 28), torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        trained = model.train()(images, audio)
        evaluated = model.eval()(images, audio)
    assert torch.equal(trained, evaluated)


# ------------------------------------------------------------------------------------ grid pooling


@pytest.mark.parametrize("n_in", [4, 5, 7, 9, 28, 112])
def test_pooling_windows_are_adaptive_poolings_windows(n_in: int) -> None:
    """Each window holds exactly the positions that adaptive pooling averages into that output (read from torch's
    own op: pooling a one-hot position vector is non-zero in the outputs whose window holds the position)."""
    windows = pooling_windows(n_in, 4)
    for p in range(n_in):
        onehot = torch.zeros(1, 1, n_in, dtype=torch.float64)
        onehot[..., p] = 1.0
        covers = (F.adaptive_avg_pool1d(onehot, 4)[0, 0] > 0).tolist()
        assert covers == [a <= p < b for a, b in windows]


@pytest.mark.parametrize("shape", [(7, 7), (28, 28), (4, 4), (5, 9), (8, 6), (112, 28)])
def test_window_average_is_adaptive_average_pooling_with_its_gradient(shape: tuple[int, int]) -> None:
    """Divisible sides (avg_pool2d), overlapping windows (slices) and a mix of the two: the values and the input's
    gradient of torch's adaptive pooling, to float64 rounding."""
    torch.manual_seed(0)
    x = torch.randn(3, 2, *shape, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    ours, = torch.autograd.grad((window_average(x, 4) * weights).sum(), x)
    theirs, = torch.autograd.grad((F.adaptive_avg_pool2d(x, 4) * weights).sum(), x)
    torch.testing.assert_close(window_average(x, 4), F.adaptive_avg_pool2d(x, 4), rtol=0, atol=1e-12)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


def _backward_nodes(out: torch.Tensor) -> set[str]:
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node.name() not in seen:
            seen.add(node.name())
            stack.extend(next_fn for next_fn, _ in node.next_functions)
    return seen


@pytest.mark.parametrize("side", [7, 28])
def test_window_average_has_no_adaptive_pooling_in_its_backward(side: int) -> None:
    """The backward that CUDA's deterministic mode refuses (adaptive pooling's) is not in the graph: the route a
    GPU takes is made of ops with deterministic CUDA backward kernels."""
    x = torch.randn(2, 3, side, side, requires_grad=True)
    nodes = _backward_nodes(window_average(x, 4))
    assert not any("Adaptive" in name for name in nodes), nodes
    assert any("Adaptive" in name for name in _backward_nodes(F.adaptive_avg_pool2d(x, 4)))  # the check can fail


def test_grid_pool_on_the_cpu_is_torchs_adaptive_pooling_to_the_bit() -> None:
    """CPU runs keep their numbers: the tokenizer's pooling there is ``nn.AdaptiveAvgPool2d`` itself, and the
    pooling layer holds no state, so checkpoints keep their keys."""
    x = torch.randn(4, 16, 7, 7, requires_grad=True)
    pool = GridPool(4)
    assert torch.equal(pool(x), torch.nn.AdaptiveAvgPool2d(4)(x))
    assert not pool.state_dict()
    assert "GridPool(size=4)" in repr(ConvTokenizer())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_suite.py runs it)")
def test_the_tokenizer_trains_deterministically_on_a_gpu() -> None:
    """Under deterministic mode the tokenizer's backward runs on a GPU (adaptive pooling's raised there) and two
    backward passes give the same gradients to the bit; its pooling agrees with torch's adaptive pooling."""
    torch.manual_seed(0)
    tokenizer = ConvTokenizer().cuda()
    x = torch.randn(8, 1, 28, 28, device="cuda")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(2):
            tokenizer.zero_grad()
            tokenizer(x).square().sum().backward()
            grads.append([p.grad.clone() for p in tokenizer.parameters()])
    finally:
        torch.use_deterministic_algorithms(was)
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    maps = torch.randn(8, 16, 7, 7, device="cuda")
    torch.testing.assert_close(GridPool(4)(maps), F.adaptive_avg_pool2d(maps, 4))


def test_window_average_compiles_whole() -> None:
    """The GPU route traces as one graph (the CLI compiles the net with ``fullgraph``-clean regions)."""
    x = torch.randn(2, 3, 7, 7)
    compiled = torch.compile(window_average, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, 4), F.adaptive_avg_pool2d(x, 4))

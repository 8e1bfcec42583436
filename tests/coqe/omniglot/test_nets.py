"""CoQE nets: ResNet sizes, causality, CoQE's dynamic/static logits, logit noise and its schedule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_icl.coqe.layers import CausalTransformer
from lit_icl.coqe.omniglot.module import NoiseSchedule
from lit_icl.coqe.omniglot.nets import CoQEClassifier, ResNetEmbedder, SequenceTransformer
from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import count_parameters

TINY = (8, 8, 8, 16)  # tiny ResNet widths


def _bottleneck(cin: int, cout: int, project: bool) -> int:
    """Parameters of one bottleneck block, written out by hand: three convs + their BNs (+ projection)."""
    mid = cout // 4
    convs = cin * mid + 3 * 3 * mid * mid + mid * cout
    bns = 2 * (mid + mid + cout)
    proj = cin * cout + 2 * cout if project else 0
    return convs + bns + proj


def _resnet_params(widths: tuple[int, ...], out: int = 64) -> int:
    stem = 7 * 7 * 64 + 2 * 64
    total, cin = stem, 64
    for c in widths:
        total += _bottleneck(cin, c, True) + _bottleneck(c, c, False)
        cin = c
    return total + (widths[-1] * out + out if widths[-1] != out else 0)


@pytest.mark.parametrize(
    ("e", "widths"), [(64, (16, 32, 32, 64)), (256, (64, 128, 128, 256)), (512, (64, 128, 256, 512))]
)
def test_resnet_parameter_counts(e: int, widths: tuple[int, ...]) -> None:
    net = ResNetEmbedder(e)
    assert net.channels == widths
    assert count_parameters(net) == _resnet_params(widths)


def test_resnet_shapes_and_model_sizes() -> None:
    net = ResNetEmbedder(64).eval()
    assert net(torch.rand(2, 105, 105)).shape == (2, 64)
    # The paper's sizes (App. C.2): Transformer E=64/L=12 "approximately 0.9M", CoQE E=256/L=4 "1.0M",
    # E=512/L=4 "2.0M". This implementation: 0.83M, 0.71M, 1.33M (docs/coqe_omniglot.md, "Parameter counts", explains the difference).
    assert round(count_parameters(SequenceTransformer(1613, 64, 12)) / 1e6, 2) == 0.83
    assert round(count_parameters(CoQEClassifier(1613, 256, 4)) / 1e6, 2) == 0.71
    assert round(count_parameters(CoQEClassifier(1613, 512, 4)) / 1e6, 2) == 1.33


@pytest.mark.parametrize("size", [105, 28, 17, 16, 9])
def test_strided_input_sizes_are_the_maps_the_strided_convolutions_see(size: int) -> None:
    """The sizes the bf16-on-CPU check computes, against the maps a forward pass feeds those convolutions."""
    net = ResNetEmbedder(channels=TINY, stem_channels=8).eval()
    seen: list[int] = []
    for block in net.groups:
        if block.conv2.stride == (2, 2):
            block.conv2.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[-1]))
    net(torch.rand(1, size, size))
    assert ResNetEmbedder.strided_input_sizes(size) == seen
    assert (min(seen) <= 1) == (size <= 16)


def _nets() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [
        SequenceTransformer(12, depth=2, resnet_channels=TINY).eval(),
        CoQEClassifier(12, depth=2, resnet_channels=TINY).eval(),
    ]


@pytest.mark.parametrize("which", [0, 1])
def test_later_positions_never_change_earlier_predictions(which: int) -> None:
    net = _nets()[which]
    g = torch.Generator().manual_seed(1)
    images = torch.rand(4, 9, 16, 16, generator=g)
    labels = torch.randint(12, (4, 8), generator=g)
    base = net(images, labels).logits
    for p in range(9):
        img2, lab2 = images.clone(), labels.clone()
        img2[:, p + 1 :] = torch.rand(img2[:, p + 1 :].shape, generator=g)
        lab2[:, p:] = torch.randint(12, lab2[:, p:].shape, generator=g)  # label p comes after image p
        out = net(img2, lab2).logits
        torch.testing.assert_close(out[:, : p + 1], base[:, : p + 1], rtol=0, atol=1e-5)
        if p < 8:
            assert not torch.allclose(out[:, p + 1 :], base[:, p + 1 :])


def _coqe_reference(net: CoQEClassifier, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Query logits written per class with Python loops: mean of t over the class's label tokens, dotted
    with the query's s, for classes in the context; the static linear read-out otherwise."""
    s = net.sample_proj(net.embed(images, labels))
    t = net.task_proj(net.encoder(s))
    out = torch.empty(images.shape[0], net.n_classes)
    for b in range(images.shape[0]):
        sq = s[b, -1]
        for c in range(net.n_classes):
            tokens = [t[b, 2 * j + 1] for j in range(labels.shape[1]) if labels[b, j] == c]
            static = net.static.weight[c] @ sq + net.static.bias[c]
            if tokens:
                dyn = torch.stack(tokens).mean(0) @ sq
                out[b, c] = dyn + (static if net.context_logit == "add" else 0.0)
            else:
                out[b, c] = static
    return out


@pytest.mark.parametrize("mode", ["replace", "add"])
def test_coqe_eval_logits_dynamic_for_context_classes_static_otherwise(mode: str) -> None:
    torch.manual_seed(0)
    net = CoQEClassifier(12, depth=2, resnet_channels=TINY, context_logit=mode).eval()
    g = torch.Generator().manual_seed(2)
    images = torch.rand(3, 9, 16, 16, generator=g)
    labels = torch.randint(5, (3, 8), generator=g)  # classes 5..11 never in the context
    with torch.no_grad():
        out = net(images, labels)
        ref = _coqe_reference(net, images, labels)
    torch.testing.assert_close(out.logits[:, -1], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits[:, -1, 5:], out.static_logits[:, -1, 5:])


def test_noise_goes_only_to_non_context_classes_at_the_query() -> None:
    torch.manual_seed(0)
    net = CoQEClassifier(12, depth=1, resnet_channels=TINY, noise_on="non_context").eval()
    images = torch.rand(2, 9, 16, 16)
    labels = torch.tensor([[0, 1, 0, 1, 2, 2, 0, 1], [3, 3, 3, 4, 4, 4, 5, 6]])
    noise = torch.full((2, 12), 7.0)
    clean = net(images, labels).logits
    noisy = net(images, labels, noise).logits
    diff = noisy - clean
    torch.testing.assert_close(diff[:, :-1], torch.zeros_like(diff[:, :-1]))
    ctx = torch.zeros(2, 12, dtype=torch.bool)
    ctx[0, [0, 1, 2]] = True
    ctx[1, [3, 4, 5, 6]] = True
    torch.testing.assert_close(diff[:, -1][ctx], torch.zeros(int(ctx.sum())))
    torch.testing.assert_close(diff[:, -1][~ctx], torch.full((int((~ctx).sum()),), 7.0))
    # noise_k: only the k smallest static logits (among non-context classes) get noise.
    net.noise_k = 4
    out = net(images, labels, noise)
    d = out.logits[:, -1] - clean[:, -1]
    smallest = out.static_logits[:, -1].topk(4, largest=False).indices
    expect = torch.zeros(2, 12)
    expect.scatter_(1, smallest, 7.0)
    torch.testing.assert_close(d, expect * (~ctx))


def test_noise_on_all_reaches_every_query_logit_context_classes_included() -> None:
    torch.manual_seed(0)
    net = CoQEClassifier(12, depth=1, resnet_channels=TINY, noise_on="all").eval()
    images = torch.rand(2, 9, 16, 16)
    labels = torch.tensor([[0, 1, 0, 1, 2, 2, 0, 1], [3, 3, 3, 4, 4, 4, 5, 6]])
    noise = torch.arange(24, dtype=torch.float32).view(2, 12)  # a different value per class
    clean = net(images, labels).logits
    diff = net(images, labels, noise).logits - clean
    torch.testing.assert_close(diff[:, :-1], torch.zeros_like(diff[:, :-1]))  # the query row only
    torch.testing.assert_close(diff[:, -1], noise)


def test_public_code_rule_noises_the_k_smallest_static_logits_and_adds_the_context_logit() -> None:
    """Public code: noise on the k smallest static logits of the query row (a context class too when it is among
    them); a context class's modified logit is the stop-gradient noisy static logit plus its context logit."""
    torch.manual_seed(0)
    net = CoQEClassifier(
        12, depth=1, resnet_channels=TINY, noise_on="all", noise_k=6, context_logit="add", detach_static=True
    ).eval()
    images = torch.rand(2, 9, 16, 16)
    labels = torch.tensor([[0, 1, 0, 1, 2, 2, 0, 1], [3, 3, 3, 4, 4, 4, 5, 6]])
    noise = torch.full((2, 12), 5.0)
    out = net(images, labels, noise)
    static_q = out.static_logits[:, -1]
    smallest = torch.zeros(2, 12, dtype=torch.bool)
    smallest.scatter_(1, static_q.topk(6, largest=False).indices, True)
    ctx = torch.zeros(2, 12, dtype=torch.bool)
    ctx[0, [0, 1, 2]] = True
    ctx[1, [3, 4, 5, 6]] = True
    assert (smallest & ctx).any(), "the fixture must put a context class among the k smallest"
    with torch.no_grad():
        context_logit = _coqe_reference(net, images, labels) - static_q  # <s_q, P_c> for context classes
    expect = torch.where(ctx, static_q + context_logit, static_q) + 5.0 * smallest
    torch.testing.assert_close(out.logits[:, -1], expect, rtol=1e-5, atol=1e-5)
    # The noisy static row is gradient-stopped: L_mod trains the context path only.
    net.zero_grad()
    F.cross_entropy(out.logits[:, -1], torch.tensor([0, 3])).backward()
    assert net.static.weight.grad is None or net.static.weight.grad.abs().sum() == 0


def test_net_takes_its_class_count_late_and_refuses_a_different_one() -> None:
    torch.manual_seed(0)
    for net in (CoQEClassifier(resnet_channels=TINY, depth=1), SequenceTransformer(resnet_channels=TINY, depth=1)):
        assert net.n_classes is None
        with pytest.raises(RuntimeError, match="number of classes"):
            net(torch.rand(1, 9, 16, 16), torch.zeros(1, 8, dtype=torch.long))
        net.set_n_classes(7)
        assert net(torch.rand(2, 9, 16, 16), torch.randint(7, (2, 8))).logits.shape == (2, 9, 7)
        net.set_n_classes(7)  # idempotent
        with pytest.raises(ConfigError, match="n_classes=7 but the data has 9"):
            net.set_n_classes(9)


def test_stem_channels_sets_the_resnet_stem_width() -> None:
    net = CoQEClassifier(5, resnet_channels=TINY, depth=1, stem_channels=16)
    assert net.embed.resnet.stem[0].out_channels == 16
    assert net(torch.rand(1, 9, 28, 28), torch.zeros(1, 8, dtype=torch.long)).logits.shape == (1, 9, 5)


@pytest.mark.parametrize("cls", [CoQEClassifier, SequenceTransformer])
def test_channels_last_is_the_same_net_in_another_layout(cls) -> None:
    """With the same weights, a channels-last net gives the default net's logits and weight gradients to
    rounding; its conv weights and feature maps are NHWC, and checkpoints load either way."""
    torch.manual_seed(0)
    nchw = cls(5, resnet_channels=TINY, depth=1, stem_channels=8).train()
    nhwc = cls(5, resnet_channels=TINY, depth=1, stem_channels=8, channels_last=True).train()
    nhwc.load_state_dict(nchw.state_dict())
    convs = [(a.weight, b.weight) for a, b in zip(nchw.modules(), nhwc.modules())
             if isinstance(a, torch.nn.Conv2d) and a.in_channels > 1 and a.kernel_size != (1, 1)]
    # (the stem's one input channel and the 1x1 kernels are laid out alike in both formats)
    assert all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous() for _, w in convs)
    images, labels = torch.rand(2, 9, 28, 28), torch.randint(0, 5, (2, 8))
    out = [net(images, labels).logits for net in (nchw, nhwc)]
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-5)
    for o in out:
        o.square().mean().backward()
    for w_nchw, w_nhwc in convs:
        torch.testing.assert_close(w_nhwc.grad, w_nchw.grad, rtol=1e-3, atol=1e-5)
    back = cls(5, resnet_channels=TINY, depth=1, stem_channels=8)
    back.load_state_dict(nhwc.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), nhwc.state_dict().values()))


def test_detach_static_stops_lmod_gradient_to_the_static_head() -> None:
    for detach, grads in ((True, False), (False, True)):
        torch.manual_seed(0)
        net = CoQEClassifier(12, depth=1, resnet_channels=TINY, detach_static=detach)
        out = net(torch.rand(2, 9, 16, 16), torch.randint(3, (2, 8)))
        F.cross_entropy(out.logits[:, -1], torch.tensor([7, 8])).backward()
        assert (net.static.weight.grad is not None and net.static.weight.grad.abs().sum() > 0) == grads


def test_noise_schedule_paper_and_public_code() -> None:
    # Paper (App. C.2): N(mu0, 1), mean and std +1 every 10^4 steps.
    paper = NoiseSchedule()
    assert paper.at(0) == (5.0, 1.0)
    assert paper.at(9_999) == (5.0, 1.0)
    assert paper.at(10_000) == (6.0, 2.0)
    assert NoiseSchedule(mean0=3.0).at(99_999) == (12.0, 10.0)
    # Public code: N(5, 3^2), first increase after 2 x 10^4 steps.
    code = NoiseSchedule(5.0, std0=3.0, increment=1.0, interval=10_000, delay=10_000)
    assert code.at(19_999) == (5.0, 3.0)
    assert code.at(20_000) == (6.0, 4.0)
    assert code.at(45_000) == (8.0, 6.0)


def test_transformer_refuses_noise() -> None:
    net = _nets()[0]
    with pytest.raises(ValueError, match="no logit noise"):
        net(torch.rand(1, 9, 16, 16), torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 12))


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: ResNetEmbedder(100), ("emb_dim=100 has no preset; use one of [64, 256, 512] or give the 4 group "
                                       "widths as resnet_channels (e.g. --model.init_args.net.init_args.")),
        (lambda: ResNetEmbedder(channels=(8, 8, 8)), "resnet_channels=[8, 8, 8] must be 4 integers"),
        (lambda: ResNetEmbedder(channels=(8, 8, 8, 2)), "must be 4 integers >= 4"),
        (lambda: CausalTransformer(64, depth=2, heads=7), "not divisible by heads=7"),
        (lambda: CausalTransformer(64, depth=0), "depth=0"),
        (lambda: SequenceTransformer(0), "n_classes=0"),
        (lambda: CoQEClassifier(12, context_logit="mix", resnet_channels=TINY), "context_logit='mix'"),
        (lambda: CoQEClassifier(12, noise_k=20, resnet_channels=TINY), "noise_k=20 exceeds n_classes=12"),
        (lambda: CoQEClassifier(12, noise_k=0, resnet_channels=TINY), "noise_k=0"),
        (lambda: CoQEClassifier(12, noise_on="context", resnet_channels=TINY), "noise_on='context'"),
        (lambda: CoQEClassifier(12, resnet_channels=TINY, stem_channels=0), "stem_channels=0"),
        (lambda: ResNetEmbedder(channels=TINY, channels_last="yes"), "channels_last='yes' must be true or false"),
    ],
)
def test_nets_bad_input(build, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert needle in str(info.value) and "\n" not in str(info.value)

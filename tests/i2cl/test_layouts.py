"""I2CL's hooks on every decoder family of the installed ``transformers`` (tiny random 2-layer models, seconds).

The layout is detected from the module tree and a probe forward (``lit_icl.i2cl.nets.decoder_layout``); these
tests check it against what each family's block actually computes, independently of how it was found:

- the hooked modules are the ones whose outputs enter the residual stream (the post-sub-layer norms of Gemma-2/3
  and OLMo-2, the sub-layers themselves or their residual dropouts elsewhere);
- with ``lambda = 1, beta = 0`` every block's output is exactly its input plus the two injected vectors (Eq. 4
  acting on the residual stream, sequential and parallel blocks alike);
- with ``lambda = 0, beta = 1`` the logits are the zero-shot logits bit for bit, and ``last_logits`` equals the
  model's own head (Gemma-2's final soft-capping included);
- the captured writes of a post-norm block are that norm applied to the raw sub-layer output, by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from i2cl.helpers import FAMILIES, tiny_family

from lit_icl.core.errors import ConfigError
from lit_icl.i2cl.nets import ATTN, MLP, CausalLM

TEXTS = ["Review: a great film\nSentiment:", "Input: 12 345 6789 abc\nLabel:"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tokenizer) -> tuple[str, CausalLM]:
    # what enters the residual stream: the hook point these tests check against each block's own arithmetic
    return request.param, CausalLM.from_objects(tiny_family(request.param, len(tokenizer)), tokenizer, hook_point="write")


def _block_io(net: CausalLM):
    """Context manager recording each block's (input, output) hidden states."""
    io: dict[int, list[torch.Tensor]] = {}
    handles = []
    for i, (block, _, _) in enumerate(net.layout):
        def hook(module, args, kwargs, out, i=i):
            io[i] = [args[0] if args else kwargs["hidden_states"], out[0] if isinstance(out, tuple) else out]
        handles.append(block.register_forward_hook(hook, with_kwargs=True))
    return io, handles


def _inject_vectors_only(net: CausalLM) -> tuple[torch.Tensor, dict[int, list[torch.Tensor]]]:
    """Random context vectors injected with lambda = 1, beta = 0 into a forward of ``TEXTS[0]``: the vectors and each
    block's (input, output)."""
    ids, mask = net.encode(TEXTS[:1])
    context = torch.randn(net.n_layers, 2, net.hidden_size, generator=torch.Generator().manual_seed(0))
    coef = torch.stack([torch.ones(net.n_layers, 2), torch.zeros(net.n_layers, 2)], dim=-1)
    io, handles = _block_io(net)
    try:
        with net.inject(context, coef):
            net.last_logits(ids, mask)
    finally:
        for h in handles:
            h.remove()
    return context, io


def test_the_hooked_modules_are_what_enters_the_residual_stream(family) -> None:
    kind, net = family
    assert net.n_layers == 2
    for block, attn, mlp in net.layout:
        names = {m: n for n, m in block.named_children()}
        assert (names[attn], names[mlp]) == FAMILIES[kind]


@torch.no_grad()
def test_injected_vectors_are_added_to_the_residual_stream_exactly(family) -> None:
    """lambda = 1, beta = 0: block out = block in + v^a + v^m at every layer and token (Eq. 4 on the stream)."""
    _, net = family
    context, io = _inject_vectors_only(net)
    for layer in range(net.n_layers):
        inp, out = io[layer]
        expected = inp + context[layer, ATTN] + context[layer, MLP]
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_identity_coefficients_give_the_zero_shot_logits_bit_for_bit(family) -> None:
    _, net = family
    ids, mask = net.encode(TEXTS)
    base = net.last_logits(ids, mask)
    last = mask.sum(1) - 1
    own = net.lm(input_ids=ids, attention_mask=mask).logits[torch.arange(len(TEXTS)), last].float()
    torch.testing.assert_close(base, own, rtol=1e-5, atol=1e-5)  # the model's own head, soft-capping included
    coef = torch.stack([torch.zeros(net.n_layers, 2), torch.ones(net.n_layers, 2)], dim=-1)
    with net.inject(torch.randn(net.n_layers, 2, net.hidden_size) * 10, coef):
        assert torch.equal(net.last_logits(ids, mask), base)


@torch.no_grad()
def test_captured_writes_sum_to_the_block_update_and_post_norms_are_applied(family) -> None:
    kind, net = family
    ids, mask = net.encode(TEXTS[:1])
    raw: dict[int, torch.Tensor] = {}
    handles = []
    for i, (block, _, _) in enumerate(net.layout):
        sub = getattr(block, "self_attn", None)
        if sub is not None:
            handles.append(sub.register_forward_hook(lambda m, a, o, i=i: raw.__setitem__(i, o[0])))
    io, more = _block_io(net)
    try:
        with net.capture() as store:
            net.lm.base_model(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles + more:
            h.remove()
    for layer, (block, _, _) in enumerate(net.layout):
        inp, out = io[layer]
        torch.testing.assert_close(out - inp, store["attn"][layer] + store["mlp"][layer], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(store["hidden"][layer], out)
        if FAMILIES[kind][ATTN] == "post_attention_layernorm":  # the norm, applied by hand to the raw output
            torch.testing.assert_close(store["attn"][layer], block.post_attention_layernorm(raw[layer]))
        elif FAMILIES[kind][ATTN] == "self_attn":
            torch.testing.assert_close(store["attn"][layer], raw[layer])


# ---------------------------------------------------------------------- hook_point: module (the public code's paths)
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_module_hook_point_hooks_the_attention_and_mlp_modules_themselves(kind, tokenizer) -> None:
    net = CausalLM.from_objects(tiny_family(kind, len(tokenizer)), tokenizer, hook_point="module")
    for block, attn, mlp in net.layout:
        names = {m: n for n, m in block.named_children()}
        assert names[attn] in ("self_attn", "attn", "attention") and names[mlp] in ("mlp", "feed_forward")
    # only blocks that normalise a sub-layer's output count as post-norm (residual dropouts are the identity)
    assert net.post_norm == (FAMILIES[kind][ATTN] == "post_attention_layernorm")


@torch.no_grad()
def test_module_hook_point_on_gemma3_sends_the_injection_through_the_post_norms(tokenizer) -> None:
    """lambda = 1, beta = 0 at the modules: block out = in + post_attn_norm(v^a) + post_ffn_norm(v^m), by hand; the
    captured vectors are the raw module outputs, which the post-norms then map onto the stream writes."""
    model = tiny_family("gemma3_text", len(tokenizer))
    net = CausalLM.from_objects(model, tokenizer, hook_point="module")
    writes = CausalLM.from_objects(model, tokenizer, hook_point="write")
    ids, mask = net.encode(TEXTS[:1])
    with net.capture() as raw, writes.capture() as written:
        net.lm.base_model(input_ids=ids, attention_mask=mask)
    for layer, (block, _, _) in enumerate(net.layout):
        torch.testing.assert_close(block.post_attention_layernorm(raw["attn"][layer]), written["attn"][layer])
        torch.testing.assert_close(block.post_feedforward_layernorm(raw["mlp"][layer]), written["mlp"][layer])
    context, io = _inject_vectors_only(net)
    for layer, (block, _, _) in enumerate(net.layout):
        inp, out = io[layer]
        v = context[layer].expand(inp.shape[1], 2, -1)
        expected = inp + block.post_attention_layernorm(v[:, ATTN]) + block.post_feedforward_layernorm(v[:, MLP])
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_stream_noise_at_the_modules_of_a_post_norm_model_is_refused(tokenizer) -> None:
    net = CausalLM.from_objects(tiny_family("gemma3_text", len(tokenizer)), tokenizer, hook_point="module")
    L, D = net.n_layers, net.hidden_size
    coef = torch.stack([torch.zeros(L, 2), torch.ones(L, 2)], dim=-1)
    with pytest.raises(ValueError, match="noise_norm='stream' needs hook_point='write'"), \
            net.inject(torch.zeros(L, 2, D), coef, gamma=1e-3, noise_norm="stream"):
        pass
    from lit_icl.i2cl.module import I2CLModule

    with pytest.raises(ConfigError, match="noise_norm=stream needs the net's hook_point: write") as info:
        I2CLModule(net=net, methods=["i2cl"], noise_norm="stream")
    assert "\n" not in str(info.value)
    I2CLModule(net=net, methods=["i2cl"])  # the defaults are the public code's pairing (sub-layer noise)
    I2CLModule(net=net, methods=["i2cl"], noise_norm="stream", gamma=0.0)  # no noise, nothing to scale


def test_a_bad_hook_point_is_refused(tokenizer) -> None:
    with pytest.raises(ConfigError, match="hook_point"):
        CausalLM.from_objects(tiny_family("llama", len(tokenizer)), tokenizer, hook_point="stream")


# ---------------------------------------------------------------------- what does not fit is refused
class _Config:
    model_type, num_hidden_layers, vocab_size, hidden_size = "toy", 2, 16, 8


class _Block(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.self_attn, self.mlp, self.scale = nn.Linear(8, 8), nn.Linear(8, 8), scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.scale * self.self_attn(h)  # a scaled residual: no module's output is what is added
        return h + self.mlp(h)


class _Toy(nn.Module):
    def __init__(self, scale: float = 2.0, blocks: int = 2):
        super().__init__()
        self.config = _Config()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(_Block(scale) for _ in range(blocks))

    def forward(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.layers:
            h = block(h)
        return h


def test_a_block_whose_update_is_not_attention_plus_mlp_is_refused_in_one_line(tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"layers\[0\] \(_Block\): block output minus input is not") as info:
        CausalLM.from_objects(_Toy(scale=2.0), tokenizer)
    assert "writes found: self_attn, mlp" in str(info.value) and "\n" not in str(info.value)


def test_the_same_toy_with_a_plain_residual_is_accepted(tokenizer) -> None:
    from lit_icl.i2cl.nets import decoder_layout

    toy = _Toy(scale=1.0)
    assert [(a, m) for _, a, m in decoder_layout(toy)] == [(b.self_attn, b.mlp) for b in toy.layers]


def test_a_model_without_its_decoder_blocks_is_refused_in_one_line(tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"expected one ModuleList of 2 decoder blocks, found layers\[3\]") as info:
        CausalLM.from_objects(_Toy(scale=1.0, blocks=3), tokenizer)
    assert "\n" not in str(info.value)

"""I2CL's CausalLM on tiny random Llama and GPT-2 models (2 layers, built from configs; no weights, seconds).

Checked against independent computations: the identity coefficients reproduce zero-shot logits bit for bit; the
captured sub-layer outputs equal a hand-written forward pass; Eq. 1's residual identity and Eq. 4's injection;
the injected forward never sees a demonstration token; label words and model families that cannot work are refused.
"""


from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from i2cl.helpers import synthetic_dm

from lit_icl.core.errors import ConfigError
from lit_icl.i2cl.module import (
    I2CLModule,
)
from lit_icl.i2cl.nets import ATTN, MLP, CausalLM


# ---------------------------------------------------------------------- injection and hooks
def test_identity_coefficients_reproduce_zero_shot_logits_exactly(net: CausalLM) -> None:
    ids, mask = net.encode(["Review: a great film\nSentiment:", "Input: 12 345\nLabel:"])
    base = net.last_logits(ids, mask)
    L, D = net.n_layers, net.hidden_size
    context = torch.randn(L, 2, D) * 10  # any context vector: lambda = 0 must remove it exactly
    coef = torch.stack([torch.zeros(L, 2), torch.ones(L, 2)], dim=-1)
    with net.inject(context, coef):
        injected = net.last_logits(ids, mask)
    assert torch.equal(base, injected)
    with torch.no_grad(), net.inject(context, coef):  # the evaluation path (fused op) too
        assert torch.equal(base, net.last_logits(ids, mask))
    # a nonzero lambda changes them (the hooks are live)
    with net.inject(context, coef + torch.tensor([0.1, 0.0])):
        assert not torch.allclose(base, net.last_logits(ids, mask))


def _manual_llama(lm, ids):
    """Hand-written Llama forward (eager attention, RoPE, GQA): per-layer (attention out, MLP out), final hidden."""
    m = lm.model
    h = m.embed_tokens(ids)
    T = ids.shape[1]
    pos = torch.arange(T)[None]
    cos, sin = m.rotary_emb(h, pos)

    def rot(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat([-x2, x1], -1)

    outs = []
    for layer in m.layers:
        att = layer.self_attn
        x = layer.input_layernorm(h)
        nh, nkv = lm.config.num_attention_heads, lm.config.num_key_value_heads
        hd = lm.config.hidden_size // nh
        q = att.q_proj(x).view(1, T, nh, hd).transpose(1, 2)
        k = att.k_proj(x).view(1, T, nkv, hd).transpose(1, 2)
        v = att.v_proj(x).view(1, T, nkv, hd).transpose(1, 2)
        q = q * cos[:, None] + rot(q) * sin[:, None]
        k = k * cos[:, None] + rot(k) * sin[:, None]
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        a = att.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(1, T, nh * hd))
        h = h + a
        mo = layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(layer.post_attention_layernorm(h))) * layer.mlp.up_proj(
            layer.post_attention_layernorm(h)))
        h = h + mo
        outs.append((a, mo))
    return outs, m.norm(h)


def _manual_gpt2(lm, ids):
    """Hand-written GPT-2 forward: per-layer (attention out, MLP out), final hidden."""
    t = lm.transformer
    T = ids.shape[1]
    h = t.wte(ids) + t.wpe(torch.arange(T))[None]
    nh = lm.config.n_head
    hd = lm.config.n_embd // nh
    outs = []
    for block in t.h:
        x = block.ln_1(h)
        q, k, v = block.attn.c_attn(x).split(lm.config.n_embd, dim=-1)
        q, k, v = (z.view(1, T, nh, hd).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        a = block.attn.c_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(1, T, lm.config.n_embd))
        h = h + a
        y = block.mlp.c_fc(block.ln_2(h))
        y = 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))  # gelu_new
        mo = block.mlp.c_proj(y)
        h = h + mo
        outs.append((a, mo))
    return outs, t.ln_f(h)


@torch.no_grad()
def test_hooks_capture_exactly_attention_and_mlp_outputs(net: CausalLM) -> None:
    ids, mask = net.encode(["Review: dull and boring\nSentiment: negative\n"])
    with net.capture() as store:
        out = net.lm.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    manual = _manual_llama if net.model_type == "llama" else _manual_gpt2
    layers, final = manual(net.lm, ids)
    for layer, (a, m) in enumerate(layers):
        torch.testing.assert_close(store["attn"][layer], a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(store["mlp"][layer], m, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, final, rtol=1e-5, atol=1e-5)
    # Eq. 2: the demonstration vector is the last token's attention and MLP output of every layer
    vec = net.demonstration_vectors(["Review: dull and boring\nSentiment: negative\n"])
    for layer, (a, m) in enumerate(layers):
        torch.testing.assert_close(vec[0, layer, ATTN], a[0, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vec[0, layer, MLP], m[0, -1], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_injection_is_eq4_at_every_layer_and_token(net: CausalLM) -> None:
    """Residual bookkeeping (Eq. 1/4): block out = block in + (l v^a + b a) + (l v^m + b m), hooks on."""
    ids, mask = net.encode(["Input: abc def\nLabel:"])
    L, D = net.n_layers, net.hidden_size
    g = torch.Generator().manual_seed(1)
    context, coef = torch.randn(L, 2, D, generator=g), torch.rand(L, 2, 2, generator=g) + 0.5
    inputs: dict[int, torch.Tensor] = {}
    handles = [blk.register_forward_pre_hook(lambda mod, args, kw, i=i: inputs.__setitem__(
        i, args[0] if args else kw["hidden_states"]), with_kwargs=True) for i, (blk, _, _) in enumerate(net.layout)]
    try:
        with net.inject(context, coef), net.capture() as store:
            net.lm.base_model(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    for layer in range(L):
        # capture hooks run after the injection hooks, so they see the injected outputs
        a, m = store["attn"][layer], store["mlp"][layer]
        torch.testing.assert_close(inputs[layer] + a + m, store["hidden"][layer], rtol=1e-5, atol=1e-5)
    # and the injected outputs are the affine maps of the clean ones at every token
    with net.capture() as clean:
        with net.inject(context, coef):
            pass
        net.lm.base_model(input_ids=ids, attention_mask=mask)
    layer0_attn = coef[0, ATTN, 1] * clean["attn"][0] + coef[0, ATTN, 0] * context[0, ATTN]
    torch.testing.assert_close(store["attn"][0], layer0_attn, rtol=1e-5, atol=1e-5)


def test_noise_is_relative_to_the_residual_stream(net: CausalLM) -> None:
    """Eq. 6: with gamma > 0 the output moves by about gamma * ||o|| per coordinate, and not at gamma = 0."""
    ids, mask = net.encode(["Input: abc def\nLabel:"])
    L, D = net.n_layers, net.hidden_size
    coef = torch.stack([torch.zeros(L, 2), torch.ones(L, 2)], dim=-1)
    ctx = torch.zeros(L, 2, D)
    with torch.no_grad(), net.inject(ctx, coef, gamma=0.0):
        clean = net.last_logits(ids, mask)
    torch.manual_seed(0)
    with torch.no_grad(), net.inject(ctx, coef, gamma=1e-3, noise_norm="stream"):
        noisy = net.last_logits(ids, mask)
    diff = (noisy - clean).abs().max()
    assert 0 < diff < 1.0


@pytest.mark.parametrize("noise_norm", ["stream", "sublayer"])
@torch.no_grad()
def test_noise_scales_with_the_norm_it_is_told(net: CausalLM, noise_norm: str) -> None:
    """Layer 0's attention write gets gamma * ||x|| * eta, x the stream after it (Eq. 6) or the write itself
    (public code); eta is the first standard-normal draw after seeding."""
    ids, mask = net.encode(["Input: abc def\nLabel:"])
    L, D = net.n_layers, net.hidden_size
    coef = torch.stack([torch.zeros(L, 2), torch.ones(L, 2)], dim=-1)
    ctx = torch.zeros(L, 2, D)
    inputs: dict[int, torch.Tensor] = {}
    block = net.layout[0][0]
    handle = block.register_forward_pre_hook(
        lambda mod, args, kw: inputs.__setitem__(0, args[0] if args else kw["hidden_states"]), with_kwargs=True)
    try:
        with net.capture() as clean:
            net.lm.base_model(input_ids=ids, attention_mask=mask)
        torch.manual_seed(0)
        with net.inject(ctx, coef, gamma=0.1, noise_norm=noise_norm), net.capture() as noisy:
            net.lm.base_model(input_ids=ids, attention_mask=mask)
    finally:
        handle.remove()
    a = clean["attn"][0]
    torch.manual_seed(0)
    eta = torch.randn_like(a)
    x = a if noise_norm == "sublayer" else inputs[0] + a
    torch.testing.assert_close(noisy["attn"][0], a + 0.1 * x.norm(dim=-1, keepdim=True) * eta, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_noise_can_spare_the_first_position(net: CausalLM) -> None:
    """noise_first=False: the same draws with position 0's zeroed, so under causal attention every layer's output at
    position 0 is the clean one, and later positions are exactly the noisy run's where only position 0 differs."""
    ids, mask = net.encode(["Input: abc def\nLabel:"])
    L, D = net.n_layers, net.hidden_size
    coef = torch.stack([torch.full((L, 2), 0.1), torch.ones(L, 2)], dim=-1)
    ctx = torch.randn(L, 2, D, generator=torch.Generator().manual_seed(1))
    with net.inject(ctx, coef), net.capture() as clean:
        net.lm.base_model(input_ids=ids, attention_mask=mask)
    torch.manual_seed(0)
    with net.inject(ctx, coef, gamma=0.1, noise_norm="sublayer", noise_first=False), net.capture() as spared:
        net.lm.base_model(input_ids=ids, attention_mask=mask)
    torch.manual_seed(0)
    with net.inject(ctx, coef, gamma=0.1, noise_norm="sublayer"), net.capture() as noisy:
        net.lm.base_model(input_ids=ids, attention_mask=mask)
    for layer in range(L):
        for kind in ("attn", "mlp"):
            torch.testing.assert_close(spared[kind][layer][:, 0], clean[kind][layer][:, 0])
            assert not torch.allclose(noisy[kind][layer][:, 0], clean[kind][layer][:, 0])
            assert not torch.allclose(spared[kind][layer][:, 1:], clean[kind][layer][:, 1:])
    # layer 0's attention write at positions >= 1: the first noisy sub-layer, so its draws there are the same
    a = clean["attn"][0]
    torch.manual_seed(0)
    eta = torch.randn_like(a)
    expected = a[:, 1:] + 0.1 * a[:, 1:].norm(dim=-1, keepdim=True) * eta[:, 1:]
    torch.testing.assert_close(spared["attn"][0][:, 1:], expected, rtol=1e-5, atol=1e-5)


def test_injected_forward_attends_over_no_demonstration_tokens(net: CausalLM) -> None:
    dm = synthetic_dm()
    module = I2CLModule(net=net, methods=["zero_shot", "few_shot", "i2cl"])
    module.bind_datamodule(dm)
    data = dm.task_data()
    module.ctx_i2cl.copy_(net.demonstration_vectors(data.demo_texts).mean(0))
    seen: list[int] = []
    attn0 = net.layout[0][1]
    handle = attn0.register_forward_pre_hook(
        lambda mod, args, kw: seen.append((args[0] if args else kw["hidden_states"]).shape[1]), with_kwargs=True
    )
    texts = [data.eval[0][0]]
    query_len = net.n_tokens(data.query(texts[0]))
    try:
        module.predict_method("i2cl", texts)
        i2cl_len = seen.pop()
        module.predict_method("few_shot", texts)
        few_len = seen.pop()
    finally:
        handle.remove()
    assert i2cl_len == query_len  # keys/values of the query tokens only
    assert few_len == net.n_tokens(data.prefix + data.query(texts[0])) > query_len
    # given the same context vector, other demonstrations cannot change the I2CL prediction's logits
    ids, mask = net.encode(module._prompts("i2cl", texts))
    with torch.no_grad(), net.inject(module.ctx_i2cl, module.coefs["i2cl"]):
        before = net.last_logits(ids, mask)
    module.data.demos = list(reversed(module.data.demos))[:1]
    with torch.no_grad(), net.inject(module.ctx_i2cl, module.coefs["i2cl"]):
        after = net.last_logits(*net.encode(module._prompts("i2cl", texts)))
    assert torch.equal(before, after)


def test_label_words_sharing_a_first_token_are_refused(net: CausalLM) -> None:
    with pytest.raises(ConfigError, match="share their first token") as info:
        net.label_token_ids("Input: abc\nLabel:", ["zzzzzzq", "zzzzzzr"])
    assert "'zzzzzzq'" in str(info.value) and "\n" not in str(info.value)
    ids = net.label_token_ids("Input: abc\nLabel:", ["A", "B", "C"])
    assert len(set(ids)) == 3
    # the label token is the one the model would emit next: the query + " A" tokenises to query + [id]
    q = net.tokenizer("Input: abc\nLabel:")["input_ids"]
    assert net.tokenizer("Input: abc\nLabel: A")["input_ids"] == [*q, ids[0]]


def test_the_last_token_is_selected_exactly_with_its_gradient_and_padding_never_enters() -> None:
    """``_last_token_hidden`` picks each row's last real token by selection (no index_put in its backward): the
    values and the gradient of indexing, bit for bit, even when a padded position holds NaN."""
    from types import SimpleNamespace

    from lit_icl.i2cl.nets import _last_token_hidden

    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 4, requires_grad=True)
    with torch.no_grad():
        hidden[0, 4] = float("nan")  # a padded position of row 0
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    lm = SimpleNamespace(base_model=lambda **kw: SimpleNamespace(last_hidden_state=hidden))
    ours = _last_token_hidden(lm, torch.zeros_like(mask), mask)
    theirs = hidden[torch.arange(3), mask.sum(1) - 1]
    assert torch.equal(ours, theirs)
    weights = torch.randn(3, 4)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), hidden)
    (g_theirs,) = torch.autograd.grad((theirs * weights).sum(), hidden)
    assert torch.equal(g_ours, g_theirs)

"""I2CL on tiny random Llama and GPT-2 models (2 layers, built from configs; no weights, seconds).

Checked against independent computations: the identity coefficients reproduce zero-shot logits bit for bit; the
captured sub-layer outputs equal a hand-written forward pass; Eq. 1's residual identity; calibration lowers Eq. 5's
loss; the injected forward never sees a demonstration token; Algorithm 1's weights by hand; the data protocol.
"""

from __future__ import annotations

import copy
import glob
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from badinput import assert_rejected

from lit_icl.cli import main
from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.i2cl.data import (
    CalibrationItems,
    I2CLDataModule,
    balanced_sample,
    synthetic_example,
)
from lit_icl.i2cl.module import (
    I2CLModule,
    calibrate,
    calibration_loss,
    cosine_lambda,
    transfer_init,
)
from lit_icl.i2cl.nets import ATTN, MLP, CausalLM

CORPUS = [
    "Review: a great film , truly moving .\nSentiment: positive\n",
    "Review: dull and boring , a waste .\nSentiment: negative\n",
    "Input: abc def ghi\nLabel: A\n",
    "Input: !@ #$ %^\nLabel: B\n",
    "Input: 12 345 6789\nLabel: C\n",
    "the quick brown fox jumps over the lazy dog 0123456789",
]


def tiny_tokenizer():
    """A byte-level BPE tokenizer trained in memory on a few lines (GPT-2 style: leading-space tokens)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 20, vocab_size=400, min_frequency=1, special_tokens=["<eos>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>")


def tiny_model(kind: str, vocab: int, max_positions: int = 256, init_range: float = 0.02):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=max_positions, attn_implementation="eager",
            initializer_range=init_range,
        )
    else:
        cfg = transformers.GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=max_positions,
            attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
    return transformers.AutoModelForCausalLM.from_config(cfg).float()


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def net(request, tokenizer) -> CausalLM:
    return CausalLM.from_objects(tiny_model(request.param, len(tokenizer)), tokenizer)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer) -> str:
    """A tiny random Llama saved as a plain HF folder, for the CLI."""
    path = tmp_path_factory.mktemp("tiny_llama")
    tiny_model("llama", len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def synthetic_dm(**kw) -> I2CLDataModule:
    args = {"task": "synthetic", "eval_samples": 12, "holdout_samples": 6, "shots_per_class": 2, "synthetic_train": 60,
                "synthetic_test": 30}
    args.update(kw)
    return I2CLDataModule(**args)


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
    with torch.no_grad(), net.inject(ctx, coef, gamma=1e-3):
        noisy = net.last_logits(ids, mask)
    diff = (noisy - clean).abs().max()
    assert 0 < diff < 1.0


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


def test_test_rows_score_accuracy_and_macro_f1_of_the_predictions(net: CausalLM) -> None:
    """`test`'s accuracy and macro-F1 rows equal a hand count over the same predictions (per-class F1 averaged)."""
    module = I2CLModule(net=net, methods=["zero_shot", "few_shot"])
    dm = synthetic_dm(eval_samples=15)
    Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu").test(
        module, datamodule=dm
    )
    rows = {(r["metric"], r["method"]): r["value"] for r in module.test_rows}
    texts = [t for t, _ in module.data.eval]
    labels = torch.tensor([y for _, y in module.data.eval])
    n_classes = len(module.data.label_words)
    for m in ("zero_shot", "few_shot"):
        preds = module.predict_method(m, texts).cpu()
        f1 = []
        for c in range(n_classes):
            tp = int(((preds == c) & (labels == c)).sum())
            fp = int(((preds == c) & (labels != c)).sum())
            fn = int(((preds != c) & (labels == c)).sum())
            f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
        assert rows[("accuracy", m)] == pytest.approx(float((preds == labels).float().mean()))
        assert rows[("macro_f1", m)] == pytest.approx(sum(f1) / n_classes)


def test_calibration_lowers_the_loss(tokenizer) -> None:
    # a wider initialisation than the default 0.02, so that the context vectors can move the logits
    net = CausalLM.from_objects(tiny_model("llama", len(tokenizer), init_range=0.2), tokenizer)
    dm = synthetic_dm(shots_per_class=3)
    data = dm.task_data()
    module = I2CLModule(net=net, methods=["i2cl"])
    module.bind_datamodule(dm)
    context = net.demonstration_vectors(data.demo_texts).mean(0)
    prompts = [data.query(t) for t, _ in data.demos]
    targets = module.label_ids[torch.tensor([y for _, y in data.demos])]
    init = module.coefs["i2cl"].detach().clone()
    with torch.no_grad():
        before = float(calibration_loss(net, context, init, prompts, targets, gamma=0.0))
    coef, history = calibrate(net, context, init, prompts, targets, epochs=15, lr=0.05, lr_min=1e-5)
    with torch.no_grad():
        after = float(calibration_loss(net, context, coef, prompts, targets, gamma=0.0))
    assert after < before - 0.5, (before, after, history)  # measured: 6.96 -> 5.57
    assert coef.shape == (net.n_layers, 2, 2)
    assert all(p.grad is None for p in net.lm.parameters())  # the LM stays frozen


def test_bf16_model_injects_and_calibrates_float32_coefficients(tokenizer) -> None:
    """The GPU default (``dtype: auto`` = bf16), run on CPU: the LM in bf16, the 4L coefficients in float32."""
    f32 = tiny_model("llama", len(tokenizer), init_range=0.2)
    net = CausalLM.from_objects(copy.deepcopy(f32).to(torch.bfloat16), tokenizer)  # the same weights, rounded
    ref = CausalLM.from_objects(f32, tokenizer)
    L, D = net.n_layers, net.hidden_size
    ids, mask = net.encode(["Review: a great film\nSentiment:", "Input: 12 345\nLabel:"])
    base = net.last_logits(ids, mask)
    assert base.dtype == torch.float32  # logits come back in float32 for the loss and the argmax
    context = net.demonstration_vectors(["Review: dull and boring\nSentiment: negative\n"])[0]
    assert context.dtype == torch.float32
    identity = torch.stack([torch.zeros(L, 2), torch.ones(L, 2)], dim=-1)
    for grad in (True, False):  # the calibration path and the fused evaluation path
        with torch.set_grad_enabled(grad), net.inject(context, identity):
            assert torch.equal(base, net.last_logits(ids, mask))
    # a nonzero lambda: the bf16 injected logits follow the float32 model's to bf16 precision
    coef = (identity + torch.tensor([0.3, 0.0])).requires_grad_()
    with net.inject(context, coef):
        low = net.last_logits(ids, mask)
    with torch.no_grad(), ref.inject(context, coef):
        high = ref.last_logits(ids, mask)
    assert (low.detach() - high).abs().max() < 0.05 * high.abs().max()
    assert not torch.allclose(low.detach(), base, atol=1e-3)  # the injection moved them
    # Eq. 5's gradient reaches the float32 coefficients through the bf16 LM, and never the LM's weights
    F.cross_entropy(low, torch.tensor([3, 5])).backward()
    assert coef.grad is not None and coef.grad.dtype == torch.float32
    assert bool(coef.grad.isfinite().all()) and float(coef.grad.abs().sum()) > 0
    assert all(p.grad is None for p in net.lm.parameters())


def test_cosine_schedule_runs_from_lr_to_lr_min() -> None:
    assert cosine_lambda(0, 100, 1e-2, 1e-5, 0) == pytest.approx(1.0)
    assert cosine_lambda(100, 100, 1e-2, 1e-5, 0) == pytest.approx(1e-3)
    assert cosine_lambda(50, 100, 1e-2, 1e-5, 0) == pytest.approx(0.5 * (1 + 1e-3))
    assert cosine_lambda(4, 100, 1e-2, 0.0, 5) == pytest.approx(1.0)  # the public code's warm-up


def test_transfer_weights_match_algorithm_1_by_hand() -> None:
    c_new = torch.tensor([1.0, 0.0, 0.0, 0.0])
    sources = torch.tensor([[1.0, 0.1, 0, 0], [1.0, 1.0, 0, 0], [0.9, 0.3, 0, 0], [-1.0, 0, 0, 0]])
    ctx = torch.arange(4.0)[:, None] * torch.ones(4, 3)
    v, c, p = transfer_init(c_new, sources, ctx, threshold=0.8, temperature=0.5)
    s = torch.tensor([1 / math.sqrt(1.01), 1 / math.sqrt(2), 0.9 / math.sqrt(0.9), -1.0])
    s[2] = 0.9 / math.sqrt(0.81 + 0.09)
    keep = s > 0.8  # sources 0 and 2
    assert keep.tolist() == [True, False, True, False]
    w = torch.exp(s[keep] / 0.5) / torch.exp(s[keep] / 0.5).sum()
    torch.testing.assert_close(p[keep], w)
    assert p[~keep].abs().sum() == 0
    torch.testing.assert_close(v, (w[0] * 0 + w[1] * 2) * torch.ones(3))
    torch.testing.assert_close(c, w[0] * sources[0] + w[1] * sources[2])
    assert transfer_init(c_new, sources[3:], ctx[3:]) is None


# ---------------------------------------------------------------------- refusals (one line)
def test_over_long_prompt_is_refused(tokenizer) -> None:
    net = CausalLM.from_objects(tiny_model("gpt2", len(tokenizer), max_positions=32), tokenizer)
    with pytest.raises(ConfigError, match="exceeds the model's context of 32 tokens") as info:
        net.encode(["the quick brown fox jumps over the lazy dog " * 10])
    assert "\n" not in str(info.value)
    module = I2CLModule(net=net, methods=["zero_shot", "few_shot"])
    with pytest.raises(ConfigError, match="few-shot prompt of .* tokens exceeds") as info:
        module.bind_datamodule(synthetic_dm())
    assert "\n" not in str(info.value)


def test_label_words_sharing_a_first_token_are_refused(net: CausalLM) -> None:
    with pytest.raises(ConfigError, match="share their first token") as info:
        net.label_token_ids("Input: abc\nLabel:", ["zzzzzzq", "zzzzzzr"])
    assert "'zzzzzzq'" in str(info.value) and "\n" not in str(info.value)
    ids = net.label_token_ids("Input: abc\nLabel:", ["A", "B", "C"])
    assert len(set(ids)) == 3
    # the label token is the one the model would emit next: the query + " A" tokenises to query + [id]
    q = net.tokenizer("Input: abc\nLabel:")["input_ids"]
    assert net.tokenizer("Input: abc\nLabel: A")["input_ids"] == [*q, ids[0]]


def test_unsupported_family_is_refused_with_one_line(tokenizer) -> None:
    cfg = transformers.GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(ConfigError, match="cannot hook model_type='gpt_neox'") as info:
        CausalLM.from_objects(model, tokenizer)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------- data protocol
def test_synthetic_task_is_a_pure_function_of_seed_split_index() -> None:
    assert synthetic_example(0, "train", 7) == synthetic_example(0, "train", 7)
    assert synthetic_example(0, "train", 7) != synthetic_example(1, "train", 7)
    text, label = synthetic_example(3, "test", 5)
    assert label == 2 and all(w.isdigit() for w in text.split())
    text, label = synthetic_example(3, "test", 4)
    assert label == 1 and not any(ch.isalnum() for ch in text)
    text, label = synthetic_example(3, "test", 3)
    assert label == 0 and text.replace(" ", "").isalpha()


def test_protocol_samples_balanced_disjoint_sets(tmp_path: Path) -> None:
    rows = [{"text": f"item {i}", "label": ["neg", "pos", "mid"][i % 3]} for i in range(60)]
    rows += [{"text": f"extra {i}", "label": 0} for i in range(30)]  # class imbalance in the pool
    for name in ("train", "test"):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    dm = I2CLDataModule(task="jsonl", train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "test.jsonl"),
                        template="T: {text}\nL:", label_words=["neg", "pos", "mid"], eval_samples=30,
                        holdout_samples=9, shots_per_class=4, data_seed=3)
    data = dm.task_data()
    assert sorted(y for _, y in data.demos) == [0] * 4 + [1] * 4 + [2] * 4
    assert [sum(y == c for _, y in data.eval) for c in range(3)] == [10, 10, 10]
    assert [sum(y == c for _, y in data.holdout) for c in range(3)] == [3, 3, 3]
    assert not {t for t, _ in data.demos} & {t for t, _ in data.holdout}
    assert data.extra_query[0] not in {t for t, _ in data.demos + data.holdout}
    assert data.demo(data.demos[0]).endswith(f" {data.label_words[data.demos[0][1]]}\n")
    other = I2CLDataModule(task="jsonl", train_file=str(tmp_path / "train.jsonl"),
                           test_file=str(tmp_path / "test.jsonl"), template="T: {text}\nL:",
                           label_words=["neg", "pos", "mid"], eval_samples=30, shots_per_class=4, data_seed=4)
    assert other.task_data().eval == data.eval  # the evaluation set does not depend on the seed
    assert other.task_data().demos != data.demos
    g = make_generator(0)
    idx = balanced_sample([("x", i % 2) for i in range(7)], 5, 2, g)
    assert len(idx) == 5 and len(set(idx)) == 5


def test_hub_task_reads_a_local_copy_through_datasets(tmp_path: Path) -> None:
    """``path`` points ``datasets.load_dataset`` at a local folder; SST-2's test split is GLUE's validation."""
    pytest.importorskip("datasets")
    import csv

    for split, n in (("train", 40), ("validation", 20)):
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "label", "idx"])
            w.writerows([[f"{split} sentence {i}", i % 2, i] for i in range(n)])
    dm = I2CLDataModule(task="sst2", path=str(tmp_path), eval_samples=10, holdout_samples=4)
    data = dm.task_data()
    assert data.template == "Review: {text}\nSentiment:" and data.label_words == ["negative", "positive"]
    assert len(data.demos) == 10 and all(t.startswith("train") for t, _ in data.demos + data.holdout)
    assert len(data.eval) == 10 and all(t.startswith("validation") for t, _ in data.eval)
    assert [sum(y == c for _, y in data.eval) for c in range(2)] == [5, 5]


def test_calibration_items_reshuffle_every_epoch_as_a_pure_function() -> None:
    demos = [(f"t{i}", i % 2) for i in range(6)]
    items = CalibrationItems(demos, seed=0)
    epoch0 = [items[i]["text"] for i in range(6)]
    epoch1 = [items[6 + i]["text"] for i in range(6)]
    assert sorted(epoch0) == sorted(epoch1) == sorted(t for t, _ in demos)
    assert epoch0 != epoch1
    assert [items[6 + i]["text"] for i in range(6)] == epoch1


# ---------------------------------------------------------------------- CLI
def cli_args(tmp_path: Path, llama_dir: str, *extra: str) -> list[str]:
    return [
        "--config", "configs/i2cl_offline.yaml",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", "tiny",
        "--trainer.max_epochs", "2",
        "--trainer.enable_model_summary", "false",
        "--trainer.log_every_n_steps", "1",
        "--model.init_args.net.init_args.model_name_or_path", llama_dir,
        "--model.init_args.methods", "[zero_shot, few_shot, noise_vector, task_vector, i2cl, icl_i2cl]",
        "--data.init_args.task", "synthetic",
        "--data.init_args.train_file", "null",
        "--data.init_args.test_file", "null",
        "--data.init_args.template", "null",
        "--data.init_args.label_words", "null",
        "--data.init_args.shots_per_class", "2",
        "--data.init_args.eval_samples", "9",
        "--data.init_args.holdout_samples", "3",
        "--data.init_args.synthetic_train", "30",
        "--data.init_args.synthetic_test", "15",
        *extra,
    ]


def test_tiny_cli_fit_then_test_writes_results(tmp_path: Path, llama_dir: str) -> None:
    main(["fit", *cli_args(tmp_path, llama_dir)])
    ckpt = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert not any(k.startswith("net.") for k in state)  # the task-id, not the LM
    assert state["coefs.i2cl"].shape == (2, 2, 2) and state["ctx_i2cl"].shape == (2, 2, 32)
    assert not torch.equal(state["coefs.i2cl"], torch.tensor([0.1, 1.0]).expand(2, 2, 2))  # it trained
    main(["test", *cli_args(tmp_path, llama_dir), "--ckpt_path", str(ckpt)])
    (results,) = glob.glob(str(tmp_path / "runs" / "tiny" / "version_1" / "results.json"))
    rows = json.loads(Path(results).read_text())["rows"]
    methods = ["zero_shot", "few_shot", "noise_vector", "task_vector", "i2cl", "icl_i2cl"]
    acc = {r["method"]: r["value"] for r in rows if r["metric"] == "accuracy"}
    assert sorted(acc) == sorted(methods) and all(0 <= v <= 1 for v in acc.values())
    assert all(r["task"] == "synthetic" and r["seed"] == 0 for r in rows)
    lat = {r["method"] for r in rows if r["metric"] == "latency_ms_per_query"}
    assert lat == set(methods)
    f1 = {r["method"]: r["value"] for r in rows if r["metric"] == "macro_f1"}
    assert sorted(f1) == sorted(methods) and all(0 <= v <= 1 for v in f1.values())
    trainable = {r["method"]: r["value"] for r in rows if r["metric"] == "trainable_params"}
    assert trainable["i2cl"] == 8 and trainable["zero_shot"] == 0  # 4L with L = 2
    cached = {r["method"]: r["value"] for r in rows if r["metric"] == "cached_params"}
    assert cached["i2cl"] == 2 * 32 * 2 and cached["task_vector"] == 32 and cached["zero_shot"] == 0
    assert {r["method"] for r in rows if r["metric"] == "calibration_seconds"} == {"noise_vector", "i2cl", "icl_i2cl"}
    # Sec. 3.3: the calibrated coefficients reused with unseen demonstrations (another data_seed)
    main(["test", *cli_args(tmp_path, llama_dir, "--data.init_args.data_seed", "5"), "--ckpt_path", str(ckpt)])
    unseen = json.loads((tmp_path / "runs" / "tiny" / "version_2" / "results.json").read_text())["rows"]
    assert {r["seed"] for r in unseen} == {5}
    assert {r["value"] for r in unseen if r["metric"] == "calibration_seed"} == {0}
    # load_from_checkpoint rebuilds the LM from its config and restores the task-id, with no missing-key warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        reloaded = I2CLModule.load_from_checkpoint(ckpt)
    assert isinstance(reloaded.net, CausalLM) and bool(reloaded.is_calibrated.all())
    torch.testing.assert_close(reloaded.coefs["i2cl"].detach(), state["coefs.i2cl"], rtol=0, atol=0)
    torch.testing.assert_close(reloaded.ctx_i2cl, state["ctx_i2cl"], rtol=0, atol=0)
    # reloading the checkpoint as a task-id (Sec. 3.3) for transfer (Algorithm 1)
    from lit_icl.i2cl.module import read_task_id

    coef, ctx = read_task_id(str(ckpt))
    torch.testing.assert_close(coef, state["coefs.i2cl"])
    # Algorithm 1: a second "task" fits i2cl_transfer from this task-id (one epoch per calibration)
    main(["fit", *cli_args(tmp_path, llama_dir, "--model.init_args.methods", "[i2cl_transfer]",
                           "--model.init_args.transfer_from", f"[{ckpt}, {ckpt}]", "--model.init_args.transfer_threshold",
                           "-1.0", "--trainer.max_epochs", "1", "--trainer.logger.init_args.name", "transfer")])
    (tckpt,) = glob.glob(str(tmp_path / "runs" / "transfer" / "version_0" / "checkpoints" / "last.ckpt"))
    tstate = torch.load(tckpt, map_location="cpu", weights_only=False)["state_dict"]
    # two identical sources get equal weights, so the ensembled context vector is the source's own
    torch.testing.assert_close(tstate["ctx_i2cl_transfer"], ctx)


BAD_ROWS = [
    (["--model.init_args.methods", "[i2cl, icl]"], "methods: Expected a typing.Literal['zero_shot', 'few_shot'"),
    (["--model.init_args.methods", "[i2cl, i2cl]"], "repeats 'i2cl'"),
    (["--model.init_args.lr", "-1"], "lr=-1"),
    (["--model.init_args.lr_min", "0.5"], "lr_min=0.5"),
    (["--model.init_args.gamma", "-0.1"], "gamma=-0.1"),
    (["--model.init_args.methods", "[i2cl_transfer]"], "needs transfer_from"),
    (["--model.init_args.methods", "[i2cl_transfer]", "--model.init_args.transfer_from", "[no/such/task_id.ckpt]"],
     "cannot read task-id checkpoint 'no/such/task_id.ckpt'"),
    (["--model.init_args.transfer_threshold", "1.5"], "transfer_threshold=1.5"),
    (["--model.init_args.transfer_temperature", "0"], "transfer_temperature=0"),
    (["--model.init_args.net.init_args.dtype", "int8"], "dtype: Expected a typing.Literal['auto', 'float32'"),
    (["--data.init_args.task", "imdb"], "task: Expected a typing.Literal['sst2', 'sst5'"),
    (["--data.init_args.eval_samples", "0"], "eval_samples=0"),
    (["--data.init_args.template", "no placeholder"], "must contain {text}"),
    (["--data.init_args.label_words", "[A, A, C]"], "distinct"),
    (["--data.init_args.label_words", "[zzzzzzq, zzzzzzr, C]"], "share their first token"),
    (["--data.init_args.task", "jsonl"], "needs train_file and test_file"),
    (["--data.init_args.shots_per_class", "500"], "fewer than shots_per_class=500"),
]


@pytest.mark.parametrize("extra,needle", BAD_ROWS, ids=[r[1][:30] for r in BAD_ROWS])
def test_bad_input_is_refused_with_one_line(tmp_path, capsys, llama_dir, extra, needle) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *cli_args(tmp_path, llama_dir, *extra)], needle)


def test_unfitted_calibrated_method_is_refused_at_test(tmp_path, llama_dir, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["test", *cli_args(tmp_path, llama_dir, "--model.init_args.methods", "[zero_shot, i2cl]")])
    assert info.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("lit_icl: error:")]
    assert len(lines) == 1 and "need calibrated coefficients" in lines[0]


def test_every_i2cl_config_parses(capsys) -> None:
    """The nine hub configs and the offline one name valid classes and options (parsed, nothing loaded)."""
    configs = sorted(glob.glob("configs/i2cl_*.yaml"))
    assert len(configs) == 10
    for config in configs:
        with pytest.raises(SystemExit) as info:
            main(["fit", "--config", config, "--print_config"])
        assert info.value.code in (0, None)
        printed = capsys.readouterr().out
        assert "lit_icl.i2cl.module.I2CLModule" in printed
        task = config.split("i2cl_")[1][: -len(".yaml")]
        assert f"task: {task}" in printed or (task == "offline" and "task: jsonl" in printed)


def test_offline_transfer_overlays_compose_with_the_offline_config(capsys) -> None:
    """configs/i2cl_offline/*.yaml: three anchor tasks and the transfer run, each on top of i2cl_offline.yaml."""
    overlays = sorted(glob.glob("configs/i2cl_offline/*.yaml"))
    assert [Path(p).stem for p in overlays] == ["amazon_reviews", "nyt_editorials", "transfer", "tweets"]
    for overlay in overlays:
        with pytest.raises(SystemExit) as info:
            main(["fit", "--config", "configs/i2cl_offline.yaml", "--config", overlay, "--print_config"])
        assert info.value.code in (0, None)
        printed = capsys.readouterr().out
        name = Path(overlay).stem
        assert f"name: i2cl_offline_{name}" in printed
        if name == "transfer":  # the target stays movie_reviews; the anchors are the three task-ids
            assert "train_file: data/i2cl/movie_reviews/train.jsonl" in printed and "- i2cl_transfer" in printed
            for anchor in ("tweets", "nyt_editorials", "amazon_reviews"):
                assert f"runs/i2cl_offline_{anchor}/version_0/checkpoints/last.ckpt" in printed
        else:
            assert f"train_file: data/i2cl/{name}/train.jsonl" in printed and "i2cl_transfer" not in printed


# ---------------------------------------------------------------------- DDP (2 gloo ranks on CPU)
DDP_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TWO_RANKS = ["--trainer.devices", "2", "--trainer.accelerator", "cpu"]


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lit_icl", *args], env={**os.environ, **DDP_ENV},
                          capture_output=True, text=True, timeout=300)


def test_ddp_calibration_and_test_match_one_process(tmp_path: Path, llama_dir: str) -> None:
    """2 ranks x batch 2 calibrate exactly what 1 process x batch 4 does (gamma = 0: no per-rank noise), and
    `test` on 2 ranks scores the queries of both ranks into one accuracy, the single process's."""
    methods = ["--model.init_args.methods", "[zero_shot, noise_vector, i2cl]", "--model.init_args.gamma", "0",
               "--trainer.max_epochs", "3", "--data.init_args.eval_samples", "10"]
    # Plain DDP cannot reduce one backward per method; the refusal names the strategy that can.
    proc = _run_cli("fit", *cli_args(tmp_path / "plain", llama_dir, *methods, "--trainer.strategy", "ddp",
                                     *TWO_RANKS))
    errors = {ln for ln in proc.stderr.splitlines() if ln.startswith("lit_icl: error:")}
    assert proc.returncode == 2 and len(errors) == 1 and "ddp_find_unused_parameters_true" in errors.pop()
    proc = _run_cli("fit", *cli_args(tmp_path / "ddp", llama_dir, *methods, "--trainer.strategy",
                                     "ddp_find_unused_parameters_true", *TWO_RANKS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    main(["fit", *cli_args(tmp_path / "one", llama_dir, *methods, "--data.init_args.batch_size", "4")])
    ckpts = {k: tmp_path / k / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt" for k in ("ddp", "one")}
    states = {k: torch.load(p, map_location="cpu", weights_only=False)["state_dict"] for k, p in ckpts.items()}
    for key in ("coefs.i2cl", "coefs.noise_vector"):
        assert not torch.equal(states["one"][key], torch.tensor([0.1, 1.0]).expand(2, 2, 2))  # it trained
        # the same averaged gradients; only the order of float reductions differs
        torch.testing.assert_close(states["ddp"][key], states["one"][key], rtol=0, atol=1e-6)
    # test on 2 ranks (5 queries each) vs 1 process, both from the single-process checkpoint
    proc = _run_cli("test", *cli_args(tmp_path / "one", llama_dir, *methods, "--trainer.strategy", "ddp",
                                      *TWO_RANKS), "--ckpt_path", str(ckpts["one"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    main(["test", *cli_args(tmp_path / "one", llama_dir, *methods), "--ckpt_path", str(ckpts["one"])])
    acc = {}
    for version in (1, 2):
        rows = json.loads((tmp_path / "one" / "runs" / "tiny" / f"version_{version}" / "results.json").read_text())
        acc[version] = {(r["metric"], r["method"]): r["value"] for r in rows["rows"]
                        if r["metric"] in ("accuracy", "macro_f1")}
    assert acc[1] == acc[2]  # macro-F1 too: its per-class counts are summed over the ranks before the division
    assert sorted(acc[1]) == [(k, m) for k in ("accuracy", "macro_f1") for m in ("i2cl", "noise_vector", "zero_shot")]

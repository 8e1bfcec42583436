"""I2CLModule: test rows, noisy self-calibration (Eq. 5-6) lowers its loss, the cosine schedule, Algorithm 1's
transfer weights by hand, and prompts that do not fit the LM refused (tiny random LMs, seconds)."""


from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from i2cl.helpers import synthetic_dm, tiny_model

from lit_icl.core.errors import ConfigError
from lit_icl.i2cl.calibration import (
    calibrate,
    calibration_loss,
    cosine_lambda,
    injection_coefficients,
    lr_lambda,
    public_code_lambda,
    transfer_init,
)
from lit_icl.i2cl.module import I2CLModule
from lit_icl.i2cl.nets import CausalLM


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
    L = net.n_layers
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


def _public_code_lambda(step: int, total: int, warmup: int) -> float:
    """The public code's ``lr_lambda`` (wrapper.py, calibrate_strength), transcribed as written."""
    return min(1.0, step / warmup) * (1 + math.cos(math.pi * step / total)) / 2 if step > warmup else step / warmup


def test_public_code_schedule_is_the_authors_lambda() -> None:
    total, warmup = 500, int((0.05 * 100) * (10 // 2))  # 100 epochs of 10 demonstrations at batch 2: 25 steps
    assert warmup == 25
    for step in range(total + 1):
        assert public_code_lambda(step, total, warmup) == pytest.approx(_public_code_lambda(step, total, warmup))
    assert public_code_lambda(0, total, warmup) == 0.0  # the first step does not move the coefficients
    assert public_code_lambda(total, total, warmup) == pytest.approx(0.0, abs=1e-12)
    assert lr_lambda("public_code", 26, total, 1e-2, 0.0, warmup) == pytest.approx(0.5 * (1 + math.cos(math.pi * 26 / 500)))
    assert lr_lambda("cosine", 26, total, 1e-2, 0.0, warmup) == cosine_lambda(26, total, 1e-2, 0.0, warmup)


def test_public_code_schedule_drives_the_optimisers_of_a_fit(tokenizer, tmp_path) -> None:
    """The learning rates AdamW used at each step of a 2-epoch fit (6 demonstrations at batch 2: 3 steps per epoch)
    are lr times the authors' lambda, with int(0.34 * 6) = 2 warm-up steps."""
    net = CausalLM.from_objects(tiny_model("llama", len(tokenizer)), tokenizer)
    module = I2CLModule(net=net, methods=["i2cl"], lr_schedule="public_code", lr_min=0.0, warmup_fraction=0.34)
    seen: list[float] = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[Record()], accelerator="cpu")
    trainer.fit(module, datamodule=synthetic_dm(shots_per_class=2, batch_size=2, calibration_batches="replacement"))
    assert seen == pytest.approx([1e-2 * _public_code_lambda(s, 6, 2) for s in range(6)])


def test_public_code_schedule_needs_lr_min_zero(net: CausalLM) -> None:
    with pytest.raises(ConfigError, match="lr_schedule=public_code anneals to 0 .* set lr_min: 0") as info:
        I2CLModule(net=net, methods=["i2cl"], lr_schedule="public_code")  # lr_min keeps its default, 1e-5
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="lr_schedule"):
        I2CLModule(net=net, methods=["i2cl"], lr_schedule="linear", lr_min=0.0)


@pytest.mark.parametrize("method", ["add", "fixed_beta"])
def test_lambda_only_injections_calibrate_the_context_weights_only(tokenizer, method: str, tmp_path) -> None:
    """inject_method add (the public code's): Eq. 4 with beta = 1 and relu(lambda); fixed_beta: beta = 1 and
    lambda as trained. A fit moves lambda, the injected beta stays exactly 1, the rows count 2L trainable scalars."""
    coef = torch.tensor([[[-0.3, 0.5], [0.2, 2.0]]])
    by_hand = {"add": [[[0.0, 1.0], [0.2, 1.0]]], "fixed_beta": [[[-0.3, 1.0], [0.2, 1.0]]]}
    torch.testing.assert_close(injection_coefficients(coef, method), torch.tensor(by_hand[method]))
    assert injection_coefficients(coef, "linear") is coef
    net = CausalLM.from_objects(tiny_model("llama", len(tokenizer), init_range=0.2), tokenizer)
    module = I2CLModule(net=net, methods=["i2cl"], inject_method=method, lr=0.05)
    dm = synthetic_dm(shots_per_class=2)
    trainer = Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, datamodule=dm)
    lam = module.coefs["i2cl"].detach()[..., 0]
    assert not torch.allclose(lam, torch.full_like(lam, 0.1))  # calibrated
    assert torch.equal(injection_coefficients(module.coefs["i2cl"].detach(), method)[..., 1], torch.ones_like(lam))
    trainer.test(module, datamodule=dm)
    rows = {(r["metric"], r["method"]): r["value"] for r in module.test_rows}
    assert rows[("trainable_params", "i2cl")] == 2 * net.n_layers
    # The checkpoint reloads with its injection: the same coefficients enter Eq. 4.
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    reloaded = I2CLModule.load_from_checkpoint(tmp_path / "last.ckpt", net=net)
    assert reloaded.hparams.inject_method == method
    assert torch.equal(injection_coefficients(reloaded.coefs["i2cl"].detach(), method),
                       injection_coefficients(module.coefs["i2cl"].detach(), method))


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

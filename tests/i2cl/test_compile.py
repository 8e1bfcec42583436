"""``--compile.mode`` on I2CL: the LM's calibration forward compiles whole with the injection hooks inside, sees the
eager run's Eq. 6 noise, agrees with eager, and leaves checkpoints and every other use of the LM as they were.

The CLI test traces with ``aot_eager`` (Dynamo and AOTAutograd as under inductor, no code generation): seconds on two
cores. The inductor test is ``slow`` (its two graphs of the tiny LM's forward and backward take about a minute here).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import torch
from i2cl.helpers import cli_args, tiny_model

from lit_icl.callbacks.compile import resolve_mode
from lit_icl.cli import main
from lit_icl.i2cl.calibration import calibrate, calibration_loss
from lit_icl.i2cl.nets import CausalLM

TRACE = ["--compile.mode", "default", "--compile.backend", "aot_eager", "--compile.fullgraph", "true"]
METHODS = ["--model.init_args.methods", "[zero_shot, noise_vector, task_vector, i2cl, icl_i2cl]"]


def _fresh_net(tokenizer) -> CausalLM:
    return CausalLM.from_objects(tiny_model("llama", len(tokenizer)), tokenizer)


def _state(root: Path, name: str) -> dict[str, torch.Tensor]:
    (ckpt,) = glob.glob(str(root / "runs" / name / "version_0" / "checkpoints" / "last.ckpt"))
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


def test_compiled_calibration_traces_whole_and_matches_eager(tmp_path, llama_dir) -> None:
    """fullgraph=True over two epochs of three calibrated methods (prompts of many lengths, with and without the
    demonstrations): no graph break, the same checkpoint keys, and the coefficients of the eager run to rounding
    (aot_eager runs the eager aten ops, and the pre-drawn Eq. 6 noise is the eager run's: they were equal to the bit
    here)."""
    main(["fit", *cli_args(tmp_path, llama_dir, *METHODS, "--trainer.logger.init_args.name", "eager")])
    torch._dynamo.reset()
    main(["fit", *cli_args(tmp_path, llama_dir, *METHODS, *TRACE, "--trainer.logger.init_args.name", "traced")])
    eager, traced = _state(tmp_path, "eager"), _state(tmp_path, "traced")
    assert list(traced) == list(eager)
    assert not any("_orig_mod" in key or "calibration_forward" in key for key in traced)
    for key in ("coefs.noise_vector", "coefs.i2cl", "coefs.icl_i2cl"):
        assert not torch.equal(traced[key], torch.tensor([0.1, 1.0]).expand_as(traced[key])), "nothing calibrated"
        torch.testing.assert_close(traced[key], eager[key], rtol=1e-5, atol=1e-6, msg=key)
    # Test-time uses of the LM (context vectors, task vector, zero-shot) stay eager: the compiled run's checkpoint
    # scores what the eager run's scores, in the results.json the shared writer makes.
    scores = {}
    for name in ("eager", "traced"):
        main(["test", *cli_args(tmp_path, llama_dir, *METHODS, "--trainer.logger.init_args.name", name),
              "--ckpt_path", str(tmp_path / "runs" / name / "version_0" / "checkpoints" / "last.ckpt")])
        rows = json.loads((tmp_path / "runs" / name / "version_1" / "results.json").read_text())["rows"]
        scores[name] = {(r["metric"], r["method"]): r["value"] for r in rows if r["metric"] in ("accuracy", "macro_f1")}
    assert len(scores["eager"]) == 10 and scores["traced"] == scores["eager"]


def test_drawn_noise_is_the_eager_hooks_noise(tokenizer) -> None:
    """Eq. 6's draws made ahead (what a compiled forward is fed) give the eager forward's logits to the bit."""
    net = _fresh_net(tokenizer)
    L, D = net.n_layers, net.hidden_size
    context, coef = torch.randn(L, 2, D), torch.tensor([0.3, 0.9]).expand(L, 2, 2).clone()
    ids, mask = net.encode(["Review: a great film\nSentiment:", "Review: dull\nSentiment:"])
    for norm in ("sublayer", "stream"):
        torch.manual_seed(3)
        with net.inject(context, coef, gamma=0.5, noise_norm=norm):
            drawn_in_hooks = net.calibration_logits(ids, mask)
        torch.manual_seed(3)
        noise = net.draw_noise(ids)
        with net.inject(context, coef, gamma=0.5, noise_norm=norm, noise=noise):
            drawn_ahead = net.calibration_logits(ids, mask)
        assert torch.equal(drawn_ahead, drawn_in_hooks)
    with pytest.raises(ValueError, match="does not fit"), net.inject(context, coef, gamma=0.5, noise=noise[:, :1]):
        pass
    # calibration_loss draws ahead exactly when the forward is compiled (inductor draws from its own generator)
    assert not net.calibration_compiled
    net.calibration_forward.compile(backend="eager")
    assert net.calibration_compiled
    assert net.lm._compiled_call_impl is None  # the LM itself, which every other use calls, stays eager


def test_auto_leaves_i2cl_eager_even_on_a_gpu(monkeypatch) -> None:
    """``auto`` (the CLI's default) compiles a paper's nets with CUDA graphs on a GPU that inductor supports, except
    I2CL's (compiling costs more than its calibration takes); a named mode compiles I2CL too."""
    from lit_icl.callbacks import compile as compile_module
    from lit_icl.i2cl import I2CLModule
    from lit_icl.icssl import ICSSLModule

    i2cl, icssl = I2CLModule.__new__(I2CLModule), ICSSLModule.__new__(ICSSLModule)
    cuda = torch.device("cuda")
    for supported in (True, False):
        monkeypatch.setattr(compile_module, "inductor_supports", lambda device, s=supported: s)
        assert resolve_mode("auto", cuda, i2cl) == "off"
        assert resolve_mode("auto", cuda, icssl) == ("reduce-overhead" if supported else "off")
        assert resolve_mode("default", cuda, i2cl) == "default"
    assert resolve_mode("auto", torch.device("cpu"), icssl) == "off"


@pytest.mark.slow  # two inductor graphs of the tiny LM: about a minute on two cores
def test_inductor_calibration_agrees_with_eager_over_20_steps(tokenizer) -> None:
    """The stated tolerance of a compiled calibration: 20 steps of Eq. 5 under Eq. 6 noise (gamma 1e-3, prompts of
    varying length, one graph with dynamic lengths) within 1e-5 (relative) of eager's losses and coefficients
    (measured: losses equal, coefficients 2.3e-7 apart, torch 2.14 on 2 CPU cores)."""
    L = 2
    context = torch.randn(L, 2, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["Review: a great film , truly moving .\nSentiment:", "Review: dull\nSentiment:",
               "Review: a waste\nSentiment:", "Review: the quick brown fox jumps over the lazy dog\nSentiment:"] * 2
    targets = torch.tensor([5, 7] * 4)
    runs = {}
    for compiled in (False, True):
        net = _fresh_net(tokenizer)
        if compiled:
            net.calibration_forward.compile(dynamic=None)
        assert net.calibration_compiled == compiled
        torch.manual_seed(0)
        coef, history = calibrate(net, context, torch.tensor([0.1, 1.0]).expand(L, 2, 2), prompts, targets,
                                  epochs=5, batch_size=2, gamma=1e-3, seed=0)
        runs[compiled] = (coef, torch.tensor(history), float(calibration_loss(net, context, coef, prompts[:2],
                                                                             targets[:2], 0.0)))
    torch.testing.assert_close(runs[True][1], runs[False][1], rtol=1e-5, atol=0.0)
    torch.testing.assert_close(runs[True][0], runs[False][0], rtol=1e-5, atol=1e-7)
    assert runs[True][2] == pytest.approx(runs[False][2], rel=1e-5)

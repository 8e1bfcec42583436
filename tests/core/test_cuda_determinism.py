"""Every paper's training step runs on a GPU under deterministic mode, and fast there: checked on the CPU.

``torch.use_deterministic_algorithms(True)`` (``--trainer.deterministic true``) makes torch raise at a CUDA op that
has no deterministic kernel; under the CLI's default ``warn`` it warns and runs the non-deterministic one, and the
run is no longer reproducible. No such op shows on a CPU run, whose kernels are all deterministic, so a net that
uses one passes every CPU test: avMNIST's adaptive average pooling was found on an H200 (2026-11-28). Here each
paper's tiny run records the aten ops of its training and validation batches (the callbacks' metrics included)
and must hold none of the ops that torch's
documentation lists as refused on CUDA, nor an accumulating ``index_put`` (the backward of indexing), which CUDA
runs by sorting its indices: deterministic, but 21 % of IC-SSL's GPU step in the profile behind the speed issue.
Layers that pick their route by device (avMNIST's ``GridPool``) are made to take their CUDA route.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from coqe.omniglot.helpers import TRANSFORMER, coqe_args
from coqe.regression.helpers import reg_args
from icssl.helpers import tiny_args
from mmca.avmnist.helpers import avmnist_args, write_layout
from mmca.synthetic.helpers import mmca_args

from lit_icl.cli import main
from lit_icl.mmca.avmnist import nets as avmnist_nets

#: aten ops (``name`` or ``name.overload``) whose CUDA kernels deterministic mode refuses, after the list in
#: ``torch.use_deterministic_algorithms``' documentation (torch 2.14), and an accumulating ``index_put``, which CUDA
#: runs by sorting.
REFUSED_OR_SLOW_ON_CUDA = {
    "avg_pool3d_backward", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
    "adaptive_max_pool2d_backward", "fractional_max_pool2d_backward", "fractional_max_pool3d_backward",
    "max_unpool2d", "max_unpool3d", "upsample_linear1d_backward", "upsample_bilinear2d_backward",
    "_upsample_bilinear2d_aa_backward", "upsample_bicubic2d_backward", "_upsample_bicubic2d_aa_backward",
    "upsample_trilinear3d_backward", "reflection_pad1d_backward", "reflection_pad2d_backward",
    "reflection_pad3d_backward", "nll_loss2d_forward", "_ctc_loss_backward", "_embedding_bag_backward",
    "_embedding_bag_per_sample_weights_backward", "put", "put_", "histc", "bincount(weights)", "median.dim",
    "grid_sampler_2d_backward", "grid_sampler_3d_backward", "scatter_reduce(prod)", "index_put(accumulate)",
}


def _args(tmp_path: Path, run: str) -> list[str]:
    # Two training batches, and the sanity check's validation batches before them.
    record = ["--trainer.max_steps", "2", "--trainer.num_sanity_val_steps", "1",
              "--trainer.callbacks+=subprocess_callbacks.AtenOps", f"--trainer.callbacks.path={tmp_path / 'ops.txt'}"]
    if run == "icssl":
        # One epoch of the two steps, so that its validation gives the best-model checkpoint its metric.
        return [*tiny_args(tmp_path, config_callbacks=True), "--trainer.max_epochs", "-1",
                "--data.init_args.train_batches_per_epoch", "2", *record]
    if run == "coqe_regression":
        return [*reg_args(tmp_path), *record]
    if run == "mmca_synthetic":
        return [*mmca_args(tmp_path), "--trainer.max_epochs", "-1", *record]
    if run == "mmca_avmnist":
        write_layout(tmp_path / "data", audio_side=28)
        return [*avmnist_args(tmp_path, tmp_path / "data"), "--trainer.max_epochs", "-1", *record]
    if run == "i2cl":  # calibration through a tiny random Llama
        pytest.importorskip("transformers")
        from i2cl.helpers import cli_args, tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        tiny_model("llama", len(tokenizer)).save_pretrained(tmp_path / "llama")
        tokenizer.save_pretrained(tmp_path / "llama")
        return [*cli_args(tmp_path, str(tmp_path / "llama")), *record]
    return [*coqe_args(tmp_path, **({"config": TRANSFORMER} if run == "coqe_transformer" else {})), *record]


def _ops(tmp_path: Path, run: str) -> set[str]:
    main(["fit", *_args(tmp_path, run)])
    names = (tmp_path / "ops.txt").read_text().split()
    return set(names) | {name.split(".")[0] for name in names}


@pytest.mark.parametrize("run", ["icssl", "coqe_omniglot", "coqe_transformer", "coqe_regression", "mmca_synthetic",
                                 "mmca_avmnist", "i2cl"])
def test_no_training_step_uses_an_op_that_cuda_deterministic_mode_refuses_or_sorts(tmp_path, monkeypatch, run) -> None:
    monkeypatch.setattr(avmnist_nets.GridPool, "forward", lambda self, x: avmnist_nets.window_average(x, self.size))
    ops = _ops(tmp_path, run)
    assert {"mm", "addmm", "bmm", "convolution"} & ops, "the recorder saw no products: it recorded nothing"
    assert {"nll_loss_backward", "mse_loss_backward", "mul"} & ops, "the recorder saw no backward"
    assert not ops & REFUSED_OR_SLOW_ON_CUDA, sorted(ops & REFUSED_OR_SLOW_ON_CUDA)


def test_the_check_finds_torchs_adaptive_pooling_in_avmnist(tmp_path) -> None:
    """What a CPU run of avMNIST executes, its pooling's own op, is what the check would have flagged."""
    assert "_adaptive_avg_pool2d_backward" in _ops(tmp_path, "mmca_avmnist") & REFUSED_OR_SLOW_ON_CUDA

"""mmca through the CLI: a tiny fit + test end to end, test rows and figures, and the bad-input table."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import pytest
import torch
from badinput import assert_rejected
from conftest import config_args
from lightning.pytorch import Trainer
from mmca.helpers import config_id, experiment_configs
from mmca.synthetic.helpers import mmca_args
from test_configs import print_config

from lit_icl.cli import main
from lit_icl.core.results import collect_test_rows
from lit_icl.mmca import (
    DeepCrossAttention,
    LatentFactorDataModule,
    LatentFactorICLModule,
    WhiteningDiagnostic,
)


def test_tiny_fit_then_test_end_to_end(tmp_path) -> None:
    main(["fit", *mmca_args(tmp_path)])
    ckpts = glob.glob(str(tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"))
    assert ckpts, "fit must leave last.ckpt"
    main(["test", *mmca_args(tmp_path), "--ckpt_path", ckpts[0]])
    # The shared ResultsWriter put the rows and this paper's figures next to the test run's logs.
    results = sorted(glob.glob(str(tmp_path / "runs" / "tiny" / "version_*" / "results.json")))
    assert results, "test must write results.json"
    payload = json.loads(Path(results[-1]).read_text())
    assert payload["meta"]["trained_steps"] == 6
    metrics = {r["metric"] for r in payload["rows"]}
    assert {"icl_error", "mse", "alpha_hat", "beta_hat", "alpha_star", "whitening_residual"} <= metrics
    pngs = {Path(p).stem for p in glob.glob(str(Path(results[-1]).parent / "*.png"))}
    assert {"icl_error_vs_context_length", "layer_scalars", "whitening_residual"} <= pngs

    # The same checkpoint outside the CLI: the net is rebuilt from the stored config.
    model = LatentFactorICLModule.load_from_checkpoint(ckpts[0])
    assert isinstance(model.net, DeepCrossAttention) and model.net.d == 4 and model.test_depths == [1, 3]
    trained_alpha = float(torch.load(ckpts[0], weights_only=True)["state_dict"]["net.alpha"])
    assert float(model.net.alpha.detach()) == trained_alpha != pytest.approx(2 / 27, abs=1e-6)  # training moved alpha
    dm = LatentFactorDataModule(
        d1=2,
        d2=2,
        train_context_length=12,
        train_prompts=64,
        batch_size=64,
        chunk_size=32,
        val_prompts=32,
        test_prompts=64,
        eval_batch_size=32,
        test_context_lengths=[5, 10, 20],
    )
    trainer = Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[WhiteningDiagnostic()]
    )
    trainer.test(model, datamodule=dm)
    rows = collect_test_rows(trainer, model)  # the module's rows and the whitening callback's
    icl = {
        (r["method"], r.get("depth"), r["context_length"]): r["value"]
        for r in rows
        if r["metric"] == "icl_error"
    }
    assert set(icl) == {
        (m, t, L)
        for L in (5, 10, 20)
        for m, t in (("lca_one", 1), ("lca_one", 3), ("bayes", None), ("sample_mean", None))
    }
    assert all(icl[("bayes", None, L)] == 0.0 for L in (5, 10, 20))
    # Recompute one number independently: the sample mean's icl_error at L = 10 over the 64 test prompts.
    batch = {k: torch.cat([b[k] for b in dm.test_dataloader()]) for k in ("x", "y", "x_query", "m", "zeta")}
    w = batch["zeta"].unsqueeze(-1) * batch["m"] / (1 + batch["m"].pow(2).sum(-1, keepdim=True))
    expect = float((batch["y"][:, :10].mean(-1) - (w * batch["x_query"]).sum(-1)).pow(2).mean())
    assert icl[("sample_mean", None, 10)] == pytest.approx(expect, rel=1e-5)
    # ... and the trained LCA's at depth 3, L = 20 from Lemma C.2: y_hat = alpha y^T X^T sum_k M^k x_q / L.
    X = batch["x"].double().transpose(1, 2)
    M = torch.eye(4, dtype=torch.float64) - trained_alpha * X @ X.transpose(1, 2) / 20
    S = sum(torch.linalg.matrix_power(M, k) for k in range(3))
    xq = batch["x_query"].double().unsqueeze(-1)
    pred = trained_alpha * (batch["y"].double().unsqueeze(1) @ X.transpose(1, 2) @ S @ xq).flatten() / 20
    expect = float((pred - (w.double() * batch["x_query"].double()).sum(-1)).pow(2).mean())
    assert icl[("lca_one", 3, 20)] == pytest.approx(expect, rel=1e-4)
    layers = sorted(r["layer"] for r in rows if r["metric"] == "alpha_hat")
    assert layers == [1, 2, 3]
    assert all(r["value"] == pytest.approx(trained_alpha) for r in rows if r["metric"] == "alpha_hat")
    white = [r for r in rows if r["metric"] == "whitening_residual"]
    assert [r["layer"] for r in white] == [1, 2, 3] and all(r["context_length"] == 20 for r in white)
    assert any(r["metric"] == "alpha_star" and r["value"] == pytest.approx(2 / 27) for r in rows)
    assert all(
        set(r) >= {"metric", "value", "split", "method"} and isinstance(r["value"], float) for r in rows
    )
    figs = model.test_figures(rows)
    assert set(figs) == {
        "icl_error_vs_context_length",
        "mse_vs_context_length",
        "icl_error_vs_depth",
        "layer_scalars",
        "whitening_residual",
    }


def test_fitting_a_net_without_parameters_is_refused(tmp_path, capsys) -> None:
    args = [
        "fit",
        *mmca_args(tmp_path),
        "--model.init_args.net",
        "lit_icl.mmca.SampleMean",
        "--model.init_args.test_depths",
        "null",
    ]
    assert_rejected(tmp_path, capsys, args, "SampleMean has no trainable parameters; evaluate it with `test`")


# (args, needle): each must stop the CLI with exit 2, one line naming the problem, and no run folder.
BAD_INPUT = [
    (["--model.init_args.net", "lit_icl.mmca.BayesOptimal"], "test_depths needs a net with layers"),
    (
        [
            "--trainer.callbacks+=lit_icl.mmca.WhiteningDiagnostic",
            "--trainer.callbacks.context_length=50",
        ],
        "WhiteningDiagnostic context_length=50 exceeds the longest test context 20",
    ),
    (
        ["--model.init_args.net.init_args.d", "6"],
        "the net was built for d=6 but the data has d = d1 + d2 = 4",
    ),
    (["--model.init_args.net.init_args.norm_range", "[0, 2]"], "differs from the data's norm_range"),
    (["--data.init_args.d1", "0"], "d1=0 must be >= 1"),
    (["--data.init_args.norm_range", "[5, 1]"], "norm_range=(5.0, 1.0) must be (low, high) with low < high"),
    (["--data.init_args.batch_size", "48"], "batch_size=48 must be a positive multiple of chunk_size=32"),
    (["--data.init_args.train_prompts", "96"], "must divide train_prompts=96"),
    (["--data.init_args.test_context_lengths", "[]"], "test_context_lengths is empty"),
    (
        ["--model.init_args.net.init_args.parametrization", "fulll"],
        "parametrization: Expected a typing.Literal['one', 'two', 'untied', 'diagonal', 'full']. Got value: fulll",
    ),
    (["--model.init_args.net.init_args.depth", "0"], "depth=0 must be >= 1"),
    (["--model.init_args.net.init_args.init", "theorem_6_3"], "needs beta_init in (-2/(m_hi+1), 0)"),
    (
        ["--model.init_args.optimizer", "rmsprop"],
        "optimizer: Expected a typing.Literal['sgd', 'adam']. Got value: rmsprop",
    ),
    (["--model.init_args.lr", "0"], "lr=0"),
    (["--model.init_args.optimizer", "sgd", "--model.init_args.momentum", "1.5"], "momentum=1.5 must lie in [0, 1)"),
    (["--model.init_args.momentum", "0.9"], "momentum=0.9 is SGD's; optimizer=adam ignores it"),
    (
        [
            "--model.init_args.net.init_args.parametrization",
            "untied",
            "--model.init_args.test_depths",
            "[1, 3]",
        ],
        "needs weights tied across layers",
    ),
    (
        [
            "--trainer.callbacks+=lit_icl.mmca.WhiteningDiagnostic",
            "--trainer.callbacks.context_length=0",
        ],
        "context_length=0 must be >= 1",
    ),
    (["--data.init_args.generate_on_device", "sometimes"], "generate_on_device: Expected a <class 'bool'>"),
    # sizes no machine holds: failed at the first batch, after the run folder existed, with a traceback
    # (64 prompts x 13 tokens x (1e12 + 3) values x 4 bytes = 3099441.5 GiB)
    (["--data.init_args.d1", "1000000000000"], ("the fixed training set would need 3099441.5 GiB (train_prompts=64 "
     "prompts of 13 tokens x 1000000000003 values), and it has")),
    (["--data.init_args.train_context_length", "1000000000000"], "the fixed training set would need"),
    (["--data.init_args.test_context_lengths", "[5, 1000000000000]"],
     "a size in the config is far too large for this machine: one test batch would need 596046.4 GiB"),
    (["--data.init_args.train_prompts", "null", "--data.init_args.batch_size", "1000000000000"],
     "one training batch would need 242143.9 GiB (batch_size=1000000000000 prompts of 13 tokens x 5 values)"),
]


@pytest.mark.parametrize(("extra", "needle"), BAD_INPUT, ids=[n[:40] for _, n in BAD_INPUT])
def test_bad_input_table(tmp_path, capsys, extra: list[str], needle: str) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *mmca_args(tmp_path), *extra], needle)


@pytest.mark.parametrize("config", experiment_configs("synthetic"), ids=config_id)
def test_every_shipped_config_fits_and_tests_at_tiny_size(tmp_path, config: list[str]) -> None:
    """Each figure's config runs as shipped, shrunk only in sizes (d = 4, short contexts, 2 steps)."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_icl.cli import LitICLCLI

    args = [
        *config_args(config),
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.max_epochs", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--trainer.num_sanity_val_steps", "0",
        "--model.init_args.net.init_args.d", "4",
        "--data.init_args.d1", "2",
        "--data.init_args.d2", "2",
        "--data.init_args.train_context_length", "12",
        "--data.init_args.chunk_size", "16",
        "--data.init_args.batch_size", "32",
        "--data.init_args.train_batches_per_epoch", "2",
        "--data.init_args.val_prompts", "16",
        "--data.init_args.test_prompts", "16",
        "--data.init_args.eval_batch_size", "16",
        "--data.init_args.test_context_lengths", "[6, 12]",
    ]  # fmt: skip
    merged = print_config(tuple(config))
    if merged["data"]["init_args"]["train_prompts"] is not None:  # a fixed training set (N = 2000)
        args += ["--data.init_args.train_prompts", "32"]
    cli = LitICLCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        args=args,
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    rows = cli.model.test_rows
    values = [r["value"] for r in rows if r["metric"] == "icl_error"]
    assert (
        values and all(math.isfinite(v) or v > 0 for v in values) and not any(math.isnan(v) for v in values)
    )
    assert {r["context_length"] for r in rows if r["metric"] == "icl_error"} == {6, 12}


@pytest.mark.parametrize("fresh", [False, True], ids=["fixed_set", "fresh_prompts"])
def test_a_run_resumed_inside_an_epoch_ends_bit_identical(tmp_path, fresh: bool) -> None:
    """The training batches are gathered (fixed set) or drawn (fresh prompts) after the transfer from what the
    loader ships, keys or seeds: a run stopped at step 4 of 3-step epochs and resumed to step 7 ends with the
    weights of a run that went straight to step 7."""
    data = ["--data.init_args.train_prompts", "null"] if fresh else []

    def fit(root: Path, *extra: str) -> Path:
        main(["fit", *mmca_args(root, *data, "--trainer.max_epochs", "-1", *extra)])
        return max(root.rglob("last.ckpt"), key=lambda p: p.stat().st_mtime)

    straight = fit(tmp_path / "straight", "--trainer.max_steps", "7")
    stopped = fit(tmp_path / "stopped", "--trainer.max_steps", "4")
    resumed = fit(tmp_path / "stopped", "--trainer.max_steps", "7", "--ckpt_path", str(stopped))
    a, b = (torch.load(p, map_location="cpu", weights_only=False) for p in (straight, resumed))
    assert a["global_step"] == b["global_step"] == 7
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])

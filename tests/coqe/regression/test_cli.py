"""CoQE regression through the CLI: fit and test curves per shift, least squares end to end, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from badinput import assert_rejected
from conftest import tb_scalars
from coqe.regression.helpers import BASE, overlay, reg_args

from lit_icl.cli import main
from lit_icl.coqe.regression.data import (
    PAPER_SHIFTS,
    RegressionDataModule,
)
from lit_icl.coqe.regression.module import CoQERegressionModule
from lit_icl.coqe.regression.nets import (
    LeastSquares,
)


# ------------------------------------------------------------------------------------------ CLI
@pytest.mark.parametrize(
    ("config", "method"),
    [(overlay(), "coqe"), (overlay("combination", "transformer"), "transformer")],
)
def test_fit_then_test_writes_curves_for_every_shift_and_method(tmp_path, config: tuple[str, ...], method: str) -> None:
    linear = not any("combination" in path for path in config)
    n = 8 if linear else 12  # RepresentationMetrics' k = 10 needs 11 points per prompt
    args = reg_args(tmp_path, config, n=n)
    main(["fit", *args])
    run = tmp_path / "runs/tiny/version_0"
    scalars = tb_scalars(run)
    assert len(scalars["val/mse"]) == 2 and len(scalars["train/loss"]) == 4
    ckpt = run / "checkpoints/last.ckpt"
    # The checkpoint alone rebuilds the trained model (net class, size and baselines from the config).
    loaded = CoQERegressionModule.load_from_checkpoint(ckpt, map_location="cpu")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert loaded.method == method and state.keys() == loaded.state_dict().keys()
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
    assert loaded.function_class == ("linear" if linear else "combination")
    main(["test", *args, "--ckpt_path", str(ckpt)])
    out = tmp_path / "runs/tiny/version_1"
    rows = json.loads((out / "results.json").read_text())["rows"]
    mse = [r for r in rows if r["metric"] == "mse"]
    shifts = ["id", *PAPER_SHIFTS] if linear else ["id"]
    methods = {"coqe": [method, "least_squares", "averaging", "3-nn"],
               "transformer": [method, "least_squares", "3-nn"]}[method]
    assert {(r["shift"], r["method"], r["n_context"]) for r in mse} == {
        (s, m, i) for s in shifts for m in methods for i in range(n)
    } and len(mse) == len(shifts) * len(methods) * n
    assert all(r["value"] >= 0 and r["split"] == "test" for r in mse)
    for s in shifts:  # every baseline predicts 0 from an empty context: the same error y_q^2 / d
        first = {r["value"] for r in mse if r["shift"] == s and r["n_context"] == 0 and r["method"] != method}
        assert len(first) == 1 and first.pop() > 0
    assert {r["method"] for r in mse if r["optimal"]} == ({"least_squares"} if linear else set())
    for s in shifts:
        assert (out / f"mse_{s.replace('=', '_')}.png").is_file()
    if not linear:
        probe = [r for r in rows if r["metric"] == "probe_r2"]
        assert sorted(r["feature"] for r in probe) == [0, 1, 2, 3, 4] and all(r["value"] <= 1 for r in probe)
        (mnn,) = [r for r in rows if r["metric"] == "mnn"]
        assert mnn["embeddings"] == "features~learned" and 0 <= mnn["value"] <= 1 and mnn["k"] == 10
        assert (out / "sample_representation.png").is_file()


def test_least_squares_curve_through_the_cli_equals_the_direct_computation(tmp_path) -> None:
    """`test` of a parameter-free net: the written ID curve equals the solver's MSE on the same prompts."""
    args = reg_args(tmp_path, BASE, "--data.init_args.shifts", "[id]",
                    "--model.init_args.net", "lit_icl.coqe.LeastSquares", "--model.init_args.baselines", "[]")
    args = [a for i, a in enumerate(args) if not (a.startswith("--model.init_args.net.init_args") or
                                                  (i and args[i - 1].startswith("--model.init_args.net.init_args")))]
    main(["test", *args])
    rows = json.loads((tmp_path / "runs/tiny/version_0/results.json").read_text())["rows"]
    curve = [r["value"] for r in sorted((r for r in rows if r["metric"] == "mse"), key=lambda r: r["n_context"])]
    dm = RegressionDataModule("linear", n_points=8, chunk_size=4, batch_size=8, eval_batch_size=8, val_prompts=8,
                              test_prompts=8, generate_on_device=False)
    batch = next(iter(dm.test_dataloader()[0]))
    expected = ((LeastSquares()(batch["xs"], batch["ys"]) - batch["ys"]).double() ** 2).mean(0) / 10
    assert torch.allclose(torch.tensor(curve, dtype=torch.float64), expected, rtol=1e-6)


BAD = [
    ([], "--data.init_args.function_class=cubic", "function_class: Expected a typing.Literal"),
    ([], "--data.init_args.shifts=[id, x_scale=-1]", "shift 'x_scale=-1'"),
    ([], "--data.init_args.shifts=[id, x_scale=1e400]", "shift 'x_scale=1e400' is not understood"),  # inf
    ([], "--data.init_args.shifts=[orthant, id]", "must start with id"),
    ([], "--data.init_args.shifts=[id, id]", "repeats 'id'"),
    ([], "--data.init_args.n_points=1", "n_points=1"),
    ([], "--data.init_args.batch_size=10", "batch_size=10 must be a positive multiple of chunk_size=64"),
    ([], "--data.init_args.curriculum_points=[11, 31, 2, 2000]", "its end must equal n_points=41"),
    ([], "--data.init_args.curriculum_points=[11, 41, 0, 1]", "an increment of 0 never grows 11 to 41"),
    ([], "--data.init_args.curriculum_dims=[5, 10]", "must be null or [start, end, inc, interval]"),
    ([], "--data.init_args.n_dims=8", "has n_dims=10 but the data has 8"),
    ([], "--model.init_args.net.init_args.max_points=20", "max_points=20 < the data's n_points=41"),
    ([], "--model.init_args.net.init_args.heads=3", "width=64 is not divisible by heads=3"),
    ([], "--model.init_args.net.init_args.task_head=linear", "task_head: Expected a typing.Literal"),
    ([], "--model.init_args.net.init_args.output_scale=0", "output_scale=0"),
    ([], "--model.init_args.net.init_args.output_scale=-1", "output_scale=-1"),
    ([], "--model.init_args.net.init_args.output_scale=nan", "output_scale: nan is not a finite number"),
    ([], "--model.init_args.lr=-1", "lr=-1"),
    # sizes no machine holds: failed at the first batch, after the run folder existed, with a traceback
    ([], "--data.init_args.batch_size=1000000000000", ("far too large for this machine: one training batch would "
     "need 1680105.9 GiB (batch_size=1000000000000 prompts of 41 points x 11 values)")),
    (["--data.init_args.function_class=relu"], "--data.init_args.hidden=100000000000000",
     "the ReLU class's first layer would need 3725290.3 GiB (n_dims=10 x hidden=100000000000000 values)"),
    # Another experiment's parts: named as such first, before their own checks read this config's values.
    ([], "--data=lit_icl.mmca.LatentFactorDataModule", ("is a data module of lit_icl.mmca.synthetic, but --model "
     "CoQERegressionModule is lit_icl.coqe.regression's module")),
    ([], "--data=lit_icl.coqe.OmniglotSequenceDataModule", "is a data module of lit_icl.coqe.omniglot"),
    ([], "--model.init_args.net=lit_icl.coqe.CoQEClassifier", "CoQEClassifier is not a regression net"),
    (["--model.init_args.baselines+=lit_icl.coqe.LeastSquares"], None, "appear twice"),
    (["--model.init_args.baselines+=lit_icl.coqe.NearestNeighbours", "--model.init_args.baselines.init_args.k=0"], None,
     "k=0 must be >= 1; the neighbours the NearestNeighbours baseline averages"),
    (["--model.init_args.baselines+=lit_icl.coqe.Lasso", "--model.init_args.baselines.init_args.alpha=0"], None,
     "alpha=0"),
]


@pytest.mark.parametrize(("pre", "arg", "needle"), BAD, ids=[b[2][:30] for b in BAD])
def test_bad_input_is_rejected_before_anything_is_written(tmp_path, capsys, pre, arg, needle) -> None:
    args = ["fit", "--config", BASE,
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *pre]
    if arg is not None:
        args.append(arg)
    assert_rejected(tmp_path, capsys, args, needle)


def test_fit_refuses_a_parameter_free_net(tmp_path, capsys) -> None:
    args = ["fit", "--config", BASE, "--config", overlay("sparse")[1], "--trainer.logger.init_args.save_dir",
            str(tmp_path / "runs"), "--model.init_args.net", "lit_icl.coqe.LeastSquares", "--model.init_args.baselines=[]"]
    assert_rejected(tmp_path, capsys, args, "has no trainable parameters")


def test_combination_needs_five_dimensions() -> None:
    from lit_icl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="defined on 5 dimensions"):
        RegressionDataModule("combination", n_dims=6)
    with pytest.raises(ConfigError, match="sparsity=11 exceeds n_dims=10"):
        RegressionDataModule("sparse", sparsity=11)


def test_representation_metrics_rows_are_opt_in() -> None:
    from lit_icl.callbacks import RepresentationMetrics
    from lit_icl.core.errors import ConfigError

    assert RepresentationMetrics().rows is False and RepresentationMetrics().test_rows == []
    with pytest.raises(ConfigError, match="rows='yes' must be true or false"):
        RepresentationMetrics(rows="yes")  # type: ignore[arg-type]


@pytest.mark.slow  # a 2-rank test in a subprocess: about 30 s on 2 cores
def test_a_ddp_test_logs_the_synced_curves_of_one_process_without_lightnings_sync_warning(tmp_path) -> None:
    """2 gloo ranks score one chunk of 4 prompts each and write the rows one process writes. The logged
    ``test/mse/.../last`` values are synced by the metrics' ``compute``; logged with ``sync_dist=False`` they made
    Lightning warn once per value (28 lines here) that they were not accumulated across devices."""
    import os
    import subprocess
    import sys

    config = overlay("cpu")
    main(["fit", *reg_args(tmp_path / "fit", config)])
    ckpt = str(tmp_path / "fit/runs/tiny/version_0/checkpoints/last.ckpt")
    main(["test", *reg_args(tmp_path / "one", config), "--ckpt_path", ckpt])
    two = ["--trainer.strategy", "ddp", "--trainer.devices", "2"]
    proc = subprocess.run([sys.executable, "-m", "lit_icl", "test", *reg_args(tmp_path / "ddp", config, *two),
                           "--ckpt_path", ckpt], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sync_dist=True" not in proc.stderr
    rows = {run: json.loads((tmp_path / run / "runs/tiny/version_0/results.json").read_text())["rows"]
            for run in ("one", "ddp")}
    assert len(rows["ddp"]) == len(rows["one"]) > 0
    for a, b in zip(rows["one"], rows["ddp"]):
        assert {k: v for k, v in a.items() if k != "value"} == {k: v for k, v in b.items() if k != "value"}
        assert b["value"] == pytest.approx(a["value"], rel=1e-9, abs=1e-12)
    scalars = {run: tb_scalars(tmp_path / run / "runs/tiny/version_0") for run in ("one", "ddp")}
    last = [tag for tag in scalars["one"] if tag.startswith("test/mse/") and tag.endswith("/last")]
    assert len(last) == 28
    for tag in last:
        assert scalars["ddp"][tag][-1] == pytest.approx(scalars["one"][tag][-1], rel=1e-6, abs=1e-12)

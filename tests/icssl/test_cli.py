"""IC-SSL end to end through the CLI: DDP, bf16, test outputs, every shipped config (bad input:
tests/icssl/test_bad_input.py; paper-agnostic CLI rows: tests/test_cli.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import tb_scalars
from icssl.helpers import MANIFOLDS, all_configs, config_id, tiny_args
from lightning.pytorch import LightningDataModule, LightningModule
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_icl.cli import LitICLCLI, main
from lit_icl.icssl import ICSSLModule


def _run(args: list[str]) -> None:
    main(args)


def _state(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


# Bad input: table-driven, in tests/icssl/test_bad_input.py (shared assertion in tests/badinput.py).


def test_bf16_mixed_trains_with_finite_loss(tmp_path) -> None:
    _run(["fit", *tiny_args(tmp_path, "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "1")])
    scalars = tb_scalars(tmp_path / "runs/tiny/version_0")
    assert scalars["train/loss"] and all(torch.isfinite(torch.tensor(scalars["train/loss"])))
    assert 0.0 <= scalars["val/acc/label_ratio=0.25"][-1] <= 1.0


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], None]:
    """``one_epoch(tmp_path)``: puts into ``tmp_path`` a copy of the runs folder of the tiny one-epoch fit, which is
    fitted once, at the first test that asks; each test writes into its own copy only."""
    runs: list[Path] = []

    def copy(tmp_path: Path) -> None:
        if not runs:
            root = tmp_path_factory.mktemp("one_epoch")
            _run(["fit", *tiny_args(root, "--trainer.max_epochs", "1")])
            runs.append(root / "runs")
        shutil.copytree(runs[0], tmp_path / "runs")

    return copy


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory, one_epoch) -> Callable[[str], Path]:
    """``evaluated(manifolds)``: the root of a copy of the one-epoch fit (``version_0``) that its last checkpoint then
    tested (``version_1``) and predicted (``version_2``) on ``--data.init_args.test_manifolds manifolds``, made once
    per value for the module; tests only read it. (Its 3 steps are inside the config's 100-step warm-up: the weights
    are the initial ones to within lr/100 a step, the model whose predictions once scored otherwise than test.)"""
    roots: dict[str, Path] = {}

    def get(manifolds: str) -> Path:
        if manifolds not in roots:
            root = tmp_path_factory.mktemp("evaluated")
            one_epoch(root)
            args = [*tiny_args(root), "--data.init_args.test_manifolds", manifolds,
                    "--ckpt_path", str(root / "runs/tiny/version_0/checkpoints/last.ckpt")]
            _run(["test", *args])
            _run(["predict", *args])
            roots[manifolds] = root
        return roots[manifolds]

    return get


def test_test_writes_tidy_results_with_provenance_and_figure(tmp_path, evaluated) -> None:
    root = evaluated("[cylinder]")  # the config's own test manifolds
    ckpt = root / "runs/tiny/version_0/checkpoints/last.ckpt"
    out = root / "runs/tiny/version_1"
    result = json.loads((out / "results.json").read_text())
    meta, rows = result["meta"], result["rows"]
    assert meta["checkpoint"] == str(ckpt) and meta["trained_steps"] == 3
    assert meta["seeds"] == {"seed_everything": 0, "data_seed": 0}
    assert set(meta["versions"]) == {"python", "torch", "lightning", "lit_icl"}
    assert meta["config"]["data"]["init_args"]["n_points"] == 20
    acc = [r for r in rows if r["metric"] == "accuracy" and r["method"] == "ORIG+E2E-ICL"]
    assert [r["label_ratio"] for r in acc] == [0.1, 0.25, 0.5]
    assert [r["n_labeled"] for r in acc] == [2, 5, 10]
    assert all(0.0 <= r["value"] <= 1.0 and r["split"] == "test" for r in acc)
    for method in ("labeled_majority", "class_prior", "ORIG+E2E-ICL"):
        for metric in ("accuracy", "balanced_accuracy"):
            assert len([r for r in rows if r["method"] == method and r["metric"] == metric]) == 3
    # The class-prior floor predicts one class everywhere: balanced accuracy 1/2 unless an episode's
    # unlabeled points are all of one class (then 0 or 1), accuracy the majority share (>= 1/2).
    prior = {r["metric"]: r["value"] for r in rows if r["method"] == "class_prior" and r["label_ratio"] == 0.25}
    assert prior["accuracy"] >= 0.5 and prior["balanced_accuracy"] == pytest.approx(0.5, abs=0.05)
    # The logged test metrics and the rows are the same numbers.
    scalars = tb_scalars(out)
    for r in acc:
        assert scalars[f"test/acc/label_ratio={r['label_ratio']:g}"][-1] == pytest.approx(r["value"])
    assert (out / "results.csv").read_text().startswith("metric,value,split,method,label_ratio,n_labeled")
    for stem in ("accuracy_vs_label_ratio", "balanced_accuracy_vs_label_ratio"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ea = EventAccumulator(str(next(out.glob("events.out.tfevents.*"))))
    ea.Reload()
    assert "test/accuracy_vs_label_ratio" in ea.Tags()["images"]
    # predict: per-point probabilities at every ratio, rows summing to one.
    cli = LitICLCLI(LightningModule, LightningDataModule,
                    run=False, args=tiny_args(tmp_path))
    outputs = cli.trainer.predict(cli.model, datamodule=cli.datamodule, ckpt_path=str(ckpt))
    probs = torch.cat([o["probs"] for o in outputs], dim=1)
    assert probs.shape == (3, 16, 20, 2)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 16, 20))
    # The CLI's predict writes the same outputs into its run folder, with the checkpoint it used.
    (written,) = (root / "runs/tiny").glob("version_*/predictions.pt")
    saved = torch.load(written, weights_only=True)
    assert saved["meta"]["checkpoint"] == str(ckpt)
    torch.testing.assert_close(torch.cat([o["probs"] for o in saved["predictions"]], dim=1), probs, rtol=0, atol=0)


@pytest.mark.parametrize("manifolds", ["[cylinder]", "[cylinder, sphere]"], ids=["one", "per_manifold"])
def test_predictions_score_what_test_scores_on_the_same_episodes(evaluated, manifolds) -> None:
    """Accuracy counted from ``predictions.pt`` is the accuracy ``test`` writes, per test manifold and ratio.

    ``predict`` had scored one mixed set of the test manifolds, other episodes than the per-manifold sets of
    ``test``, and its ``probs`` round margins below float32's resolution (the GD head's logits of a point far from
    every labeled one) to a tie whose argmax is class 0: counted from them, the untrained model here scored 0.767
    at 25 % labels where ``test`` said 0.717. (The shared checkpoint is that model after 3 warm-up steps.)"""
    root = evaluated(manifolds)
    rows = json.loads((root / "runs/tiny/version_1/results.json").read_text())["rows"]
    expected = {(r.get("manifold"), r["label_ratio"]): r["value"] for r in rows
                if r["metric"] == "accuracy" and r["method"] == "ORIG+E2E-ICL"}
    saved = torch.load(root / "runs/tiny/version_2/predictions.pt", weights_only=True)["predictions"]
    per_set = saved if isinstance(saved[0], list) else [saved]  # one list of batches per test set when several
    assert len(per_set) == len(expected) // 3
    scored = {}
    for batches in per_set:
        for i, ratio in enumerate(batches[0]["label_ratios"].tolist()):
            hit = torch.cat([((b["pred"][i] == b["labels"]) & ~b["labeled"][i]).float().sum(-1) for b in batches])
            shown = torch.cat([(~b["labeled"][i]).float().sum(-1) for b in batches])
            scored[(batches[0].get("test_set"), round(ratio, 6))] = (hit / shown).mean().item()  # per episode, as test
            assert torch.equal(batches[0]["pred"][i], batches[0]["logits"][i].argmax(-1))
    assert scored.keys() == expected.keys()
    for key, value in expected.items():
        assert scored[key] == pytest.approx(value, rel=1e-6), key


def test_several_test_manifolds_write_per_manifold_rows_and_figure(evaluated) -> None:
    """`test` on two manifolds: rows (and logged metrics) per manifold through the shared results writer,
    and the checkpoint reloads into the exact trained model."""
    root = evaluated("[cylinder, sphere]")
    ckpt = root / "runs/tiny/version_0/checkpoints/last.ckpt"
    out = root / "runs/tiny/version_1"
    rows = json.loads((out / "results.json").read_text())["rows"]
    acc = [r for r in rows if r["metric"] == "accuracy" and r["method"] == "ORIG+E2E-ICL"]
    assert sorted((r["manifold"], r["label_ratio"]) for r in acc) == [
        (m, q) for m in ("cylinder", "sphere") for q in (0.1, 0.25, 0.5)]
    scalars = tb_scalars(out)
    for r in acc:
        assert scalars[f"test/acc/{r['manifold']}/label_ratio={r['label_ratio']:g}"][-1] == pytest.approx(r["value"])
    assert (out / "accuracy_vs_label_ratio.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = ICSSLModule.load_from_checkpoint(ckpt)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in _state(ckpt).items())


SUBPROCESS_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
COMMON = ["--trainer.max_epochs", "1", "--model.init_args.lr_schedule", "constant"]
VAL_TAGS = ("val/acc/label_ratio=0.1", "val/acc/label_ratio=0.25", "val/acc/label_ratio=0.5", "val/loss")


def _two_rank_args(root: Path) -> list[str]:
    """Tiny IC-SSL fit on 2 gloo ranks with 8 episodes each per step."""
    return tiny_args(root, *COMMON, "--data.init_args.batch_size", "8", "--data.init_args.eval_batch_size", "8",
                     "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu")


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference for the multi-process tests: 1 process with 16 episodes per step."""
    root = tmp_path_factory.mktemp("single")
    subprocess.run(
        [sys.executable, "-m", "lit_icl", "fit", *tiny_args(root, *COMMON, "--data.init_args.batch_size", "16")],
        check=True, env={**os.environ, **SUBPROCESS_ENV}, capture_output=True, timeout=300,
    )
    return root / "runs/tiny/version_0"


def _assert_same_val_metrics(single: Path, multi: Path) -> None:
    s, d = tb_scalars(single), tb_scalars(multi)
    for tag in VAL_TAGS:
        # Same episodes, same averaged gradients; only the order of float reductions differs.
        assert abs(s[tag][-1] - d[tag][-1]) < 2e-3, (tag, s[tag], d[tag])


@pytest.mark.slow  # 22 s with its fixture, like IC-SSL's other DDP runs
def test_ddp_on_cpu_matches_single_process(tmp_path, single_process_run: Path) -> None:
    """2 gloo ranks x 8 episodes per step see the same data as 1 process x 16: same validation metrics."""
    proc = subprocess.run(
        [sys.executable, "-m", "lit_icl", "fit", *_two_rank_args(tmp_path / "ddp")],
        env={**os.environ, **SUBPROCESS_ENV}, capture_output=True, text=True, check=False, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_val_metrics(single_process_run, tmp_path / "ddp/runs/tiny/version_0")


@pytest.mark.slow  # two processes compiling with inductor: about a minute
def test_ddp_with_compiled_nets_matches_single_process(tmp_path, single_process_run: Path) -> None:
    """``--compile.mode default`` under DDP (2 gloo ranks): each rank compiles its nets inside the DDP wrapper and
    the run validates as one eager process with the double batch does (inductor's rounding on top of the ranks')."""
    proc = subprocess.run(
        [sys.executable, "-m", "lit_icl", "fit", *_two_rank_args(tmp_path / "ddp"), "--compile.mode", "default"],
        env={**os.environ, **SUBPROCESS_ENV}, capture_output=True, text=True, check=False, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled ICSSLModuleObjective, SemiSupervisedICL, InContextEigenmap, GDICLHead" in proc.stderr
    _assert_same_val_metrics(single_process_run, tmp_path / "ddp/runs/tiny/version_0")


@pytest.mark.slow  # 27 s of two processes; test_ddp_on_cpu_matches_single_process stays in the default suite
def test_ddp_test_writes_the_rows_of_one_process(tmp_path, single_process_run: Path) -> None:
    """``test`` on 2 gloo ranks scores the checkpoint like 1 process and writes one results.json with the same
    rows. (ResultsWriter once asked ``trainer.log_dir``, a broadcast, on rank 0 only: rank 0 then waited for ranks
    that had already returned and the run crashed.)"""
    ckpt = single_process_run / "checkpoints" / "last.ckpt"
    runs = {}
    for name, extra in (("one", []), ("ddp", ["--trainer.strategy", "ddp", "--trainer.devices", "2",
                                              "--trainer.accelerator", "cpu"])):
        # eval batch 8 on 2 ranks = the 16 test episodes of one process's single batch
        batch = ["--data.init_args.eval_batch_size", "8" if name == "ddp" else "16"]
        proc = subprocess.run(
            [sys.executable, "-m", "lit_icl", "test", *tiny_args(tmp_path / name, *COMMON, *batch, *extra),
             "--ckpt_path", str(ckpt)],
            env={**os.environ, **SUBPROCESS_ENV}, capture_output=True, text=True, check=False, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (results,) = (tmp_path / name / "runs" / "tiny").glob("version_*/results.json")
        runs[name] = json.loads(results.read_text())["rows"]
    assert len(runs["ddp"]) == len(runs["one"]) > 0
    for a, b in zip(runs["one"], runs["ddp"]):
        assert {k: v for k, v in a.items() if k != "value"} == {k: v for k, v in b.items() if k != "value"}
        assert b["value"] == pytest.approx(a["value"], abs=1e-6), a


@pytest.mark.slow  # three 2-rank fits in subprocesses: about a minute
def test_ddp_stopped_inside_an_epoch_and_resumed_ends_bit_identical(tmp_path) -> None:
    """On 2 gloo ranks a run stopped inside its second epoch (as ``--trainer.max_time`` stops it) and resumed with
    ``--ckpt_path last`` ends with the weights of the run that was not stopped: each rank skips its own share of
    the batches already trained on."""

    def fit(root: Path, *extra: str) -> dict:
        args = _two_rank_args(root)
        args += ["--trainer.max_epochs", "3", "--data.init_args.train_batches_per_epoch", "3", *extra]
        tests = str(Path(__file__).resolve().parents[1])  # for the stop callback
        env = {**os.environ, **SUBPROCESS_ENV, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "lit_icl", "fit", *args], env=env, capture_output=True, text=True,
                              check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)

    straight = fit(tmp_path / "straight")
    stop = '[{"class_path": "subprocess_callbacks.StopAtStep", "init_args": {"step": 4}}]'
    assert fit(tmp_path / "cut", "--trainer.callbacks", stop)["global_step"] == 4
    resumed = fit(tmp_path / "cut", "--ckpt_path", "last")
    assert straight["global_step"] == resumed["global_step"] == 9
    assert all(torch.equal(straight["state_dict"][k], resumed["state_dict"][k]) for k in straight["state_dict"])


def _torchrun() -> list[str]:
    """The torchrun of this interpreter (the script beside it, else ``python -m torch.distributed.run``)."""
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.slow  # the same check as test_ddp_on_cpu_matches_single_process, launched by torchrun
def test_torchrun_on_cpu_matches_single_process(tmp_path, single_process_run: Path) -> None:
    """``torchrun --nproc_per_node 2 -m lit_icl fit`` (what a multi-node launch runs on each node) equals one
    process with the double batch: Lightning detects the torchelastic environment and does not spawn."""
    launched = tmp_path / "torchrun"
    proc = subprocess.run(
        [*_torchrun(), "--standalone", "--nnodes", "1", "--nproc_per_node", "2", "-m", "lit_icl", "fit",
         *_two_rank_args(launched)],
        env={**os.environ, **SUBPROCESS_ENV}, capture_output=True, text=True, check=False, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Both ranks joined one gloo group of two: Lightning reports it once per rank.
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stderr + proc.stdout
    assert sorted(p.name for p in (launched / "runs" / "tiny").iterdir()) == ["version_0"]
    _assert_same_val_metrics(single_process_run, launched / "runs/tiny/version_0")
    a = _state(single_process_run / "checkpoints/last.ckpt")
    b = _state(launched / "runs/tiny/version_0/checkpoints/last.ckpt")
    assert a.keys() == b.keys()
    # Same episodes and averaged gradients; only the float reduction order differs. Adam divides by sqrt(v), so
    # an entry whose gradient is ~0 may move by up to lr (3e-3) per step either way: per entry we allow less
    # than one such step, and the weights as a whole must agree far more closely
    # (measured: max |diff| 2.9e-4, relative L2 difference 2.2e-5).
    for k in a:
        diff = (a[k].float() - b[k].float()).abs().max().item()
        assert diff < 2e-3, (k, diff)
    va = torch.cat([a[k].float().flatten() for k in a])
    vb = torch.cat([b[k].float().flatten() for k in a])
    assert ((va - vb).norm() / va.norm()).item() < 2e-4



def _merged(files: list[str]) -> dict:
    """The YAML of a base and its overlay merged key by key, lists replaced (as LightningCLI merges them)."""
    import yaml

    def merge(a: dict, b: dict) -> dict:
        return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                        for k, v in b.items()}}

    out: dict = {}
    for path in files:
        out = merge(out, yaml.safe_load(Path(path).read_text()))
    return out


@pytest.mark.parametrize("config", all_configs(), ids=config_id)
def test_checkpoint_monitor_names_an_evaluated_ratio(config: list[str]) -> None:
    """A ModelCheckpoint monitoring ``val/acc/label_ratio=r`` needs ``r`` among the data's eval ratios, else
    Lightning stops the run at the first epoch end (configs/icssl/features.yaml once monitored 0.25 of [0.03, 0.39])."""
    from lit_icl.icssl.data import ratio_key

    cfg = _merged(config)
    evaluated = {f"val/acc/{ratio_key(r)}" for r in cfg["data"]["init_args"].get("eval_label_ratios", [])}
    monitors = [c["init_args"]["monitor"] for c in cfg["trainer"].get("callbacks", [])
                if c["class_path"].endswith(("ModelCheckpoint", "RunCheckpoint")) and "monitor" in c.get("init_args", {})]
    assert monitors, config  # every IC-SSL config keeps its best model by a validation accuracy
    for monitor in monitors:
        if monitor.startswith("val/acc/"):
            assert monitor in evaluated, (config, monitor, sorted(evaluated))


# The configs of the paper's model and its ablations (the baselines' overlays: tests/icssl/test_baselines.py).
CONFIGS = [
    files for files in all_configs()
    if "InContextEigenmap" in Path(files[0]).read_text() and "lit_icl.icssl.ManifoldDataModule" in Path(files[0]).read_text()
    and (len(files) == 1 or "class_path" not in Path(files[-1]).read_text())
]
BASELINES = ["lit_icl.icssl.LaplacianEigenmap", "lit_icl.icssl.RawCoordinates"]


def _without_representation_args(args: list[str]) -> list[str]:
    """Drop the E2E representation's init args (flag + value pairs) before swapping its class."""
    flags = [i for i, a in enumerate(args) if "representation.init_args" in a]
    return [a for i, a in enumerate(args) if i not in flags and i - 1 not in flags]


@pytest.mark.parametrize(
    ("config", "representation"), [(c, None) for c in CONFIGS] + [([MANIFOLDS], b) for b in BASELINES],
    ids=[config_id(c) for c in CONFIGS] + [b.rsplit(".", 1)[1] for b in BASELINES],
)
def test_every_config_trains_tests_and_reloads(tmp_path, config: list[str], representation: str | None) -> None:
    """Each shipped config (and each baseline override) runs as is, shrunk to 20-point episodes, including its
    callbacks; its checkpoint reloads outside the CLI, with one call, into the exact trained model, which the base
    config and the baselines also test there, to the CLI's numbers."""
    args = tiny_args(tmp_path, "--trainer.max_epochs", "1", config=config)
    args = [a for i, a in enumerate(args) if a != "--trainer.callbacks" and args[i - 1] != "--trainer.callbacks"]
    if representation is not None:
        args = [*_without_representation_args(args), "--model.init_args.net.init_args.representation", representation]
    _run(["fit", *args])
    run = tmp_path / "runs/tiny/version_0"
    ckpts = sorted((run / "checkpoints").iterdir())
    assert any(p.name == "last.ckpt" for p in ckpts) and any(p.name.startswith("best-") for p in ckpts)
    scalars = tb_scalars(run)
    assert "val/separation/model" in scalars and "val/mnn/eig~model" in scalars
    last = run / "checkpoints/last.ckpt"
    _run(["test", *args, "--ckpt_path", str(last)])
    cli_rows = json.loads((tmp_path / "runs/tiny/version_1/results.json").read_text())["rows"]

    # One call, no CLI: the right classes, the trained weights, and the same test numbers.
    model = ICSSLModule.load_from_checkpoint(last)
    expected = (representation or "lit_icl.icssl.InContextEigenmap").rsplit(".", 1)[1]
    assert type(model.net.representation).__name__ == expected
    state = _state(last)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in state)
    assert isinstance(LightningModule.load_from_checkpoint(last), ICSSLModule)
    if config != [MANIFOLDS]:
        return  # an overlay changes the run, not how a checkpoint is tested outside the CLI: the base shows that
    cli = LitICLCLI(LightningModule, LightningDataModule,
                    run=False, save_config_callback=None,
                    args=[*args, "--trainer.logger", "false",
                          "--trainer.default_root_dir", str(tmp_path / "py")])
    cli.trainer.test(model, datamodule=cli.datamodule)
    assert model.test_rows == cli_rows


def test_a_moved_run_keeps_one_best_checkpoint_and_its_score(tmp_path: Path) -> None:
    """The config's best-model callback after the run folder is moved and resumed in place: still one
    ``best-*.ckpt`` (``save_top_k: 1``), the one its recorded path names, with the best score over all epochs.
    (Lightning's own ModelCheckpoint forgets its score and files when the folder changes, so the resumed run
    would keep a second best file.)"""
    import shutil

    monitor = "val/acc/label_ratio=0.25"
    main(["fit", *tiny_args(tmp_path / "first", "--trainer.max_epochs", "2", config_callbacks=True)])
    shutil.move(tmp_path / "first" / "runs", tmp_path / "moved" / "runs")
    main(["fit", *tiny_args(tmp_path / "moved", "--trainer.max_epochs", "4", config_callbacks=True),
          "--ckpt_path", "last"])
    run = tmp_path / "moved" / "runs" / "tiny" / "version_0"
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    assert len(best) == 1, best
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["callbacks"]
    (kept,) = [s for key, s in state.items() if monitor in key]
    assert Path(kept["best_model_path"]) == best[0]
    assert float(kept["best_model_score"]) == pytest.approx(max(tb_scalars(run)[monitor]))

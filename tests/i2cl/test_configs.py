"""Every I2CL config (each base alone, each overlay on its base) parses with ``--print_config``, names classes by
the packages' public names, resolves every class path, and runs under its own run name."""

from __future__ import annotations

import contextlib
import glob
import importlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from i2cl.helpers import EXPERIMENTS, all_configs, config_args, config_id, experiment_configs

from lit_icl.cli import main

FILES = sorted(glob.glob("configs/i2cl/*.yaml") + glob.glob("configs/i2cl/*/*.yaml"))


def print_config(files: list[str]) -> str:
    """What ``python -m lit_icl fit --config <files...> --print_config`` prints (the merged config)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        main(["fit", *config_args(files), "--print_config"])
    assert info.value.code in (0, None), f"--print_config exited with {info.value.code}"
    return out.getvalue()


def class_paths(node: Any) -> list[str]:
    """Every ``class_path`` value in a parsed config, depth first."""
    if isinstance(node, dict):
        found = [node["class_path"]] if isinstance(node.get("class_path"), str) else []
        return found + [p for v in node.values() for p in class_paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in class_paths(v)]
    return []


def resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_experiment_has_a_base_and_its_overlays() -> None:
    assert [len(experiment_configs(e)) for e in EXPERIMENTS] == [9, 5]
    assert len(FILES) == 14 and not glob.glob("configs/i2cl_*.yaml")


@pytest.mark.parametrize("files", all_configs(), ids=config_id)
def test_config_parses_and_every_class_path_resolves(files: list[str]) -> None:
    merged = yaml.safe_load(print_config(files))
    paths = class_paths(merged)
    assert {"model", "data"} <= merged.keys() and len(paths) >= 3
    for path in paths:
        assert callable(resolve(path)), path
    assert merged["model"]["class_path"] == "lit_icl.i2cl.I2CLModule"
    # The run folder is the overlay's own: runs/i2cl_<task> for Table 1 (SST-2 the base's), runs/i2cl_offline
    # and runs/i2cl_offline_<variant> for the offline demo (its transfer overlay reads the anchors' folders).
    experiment = Path(files[0]).stem
    variants = [Path(f).stem for f in files[1:]]
    name = merged["trainer"]["logger"]["init_args"]["name"]
    if experiment == "table1":
        task = variants[0] if variants else "sst2"
        assert name == f"i2cl_{task}" and merged["data"]["init_args"]["task"] == task
    else:
        assert name == "_".join(["i2cl", experiment, *variants])
        assert merged["data"]["init_args"]["task"] == "jsonl"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.removeprefix("configs/i2cl/"))
def test_config_file_names_public_classes_and_no_logger_block(path: str) -> None:
    text = Path(path).read_text()
    raw = yaml.safe_load(text)
    for class_path in class_paths(raw):
        package, _, name = class_path.rpartition(".")
        if package.startswith("lightning."):  # Lightning's own callbacks
            continue
        # lit_icl.<package>.<Name>: a name the package exports, not a file inside it.
        assert package.count(".") == 1 and package.startswith("lit_icl."), class_path
        assert name in importlib.import_module(package).__all__, class_path
    logger = (raw.get("trainer") or {}).get("logger") or {}
    assert set(logger) == {"init_args"} and set(logger["init_args"]) == {"name"}, "only the run name"
    # The first comment lines say what it shows and give the command that runs it.
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert text.startswith("# ") and f"--config {path}" in header


def test_run_names_are_unique() -> None:
    names = [yaml.safe_load(Path(p).read_text())["trainer"]["logger"]["init_args"]["name"] for p in FILES]
    assert len(set(names)) == len(names)
